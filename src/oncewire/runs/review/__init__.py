"""The review preset: a workflow on the generic run machinery.

``table`` is the workflow (its states, guards and the rows each command projects),
``commands`` the named commands a caller reaches as ``ledger.runs.review``, and ``recovery``
how reconciliation closes a review run whose owner died. Importing this package registers the
workflow.
"""

from oncewire.runs.review.commands import ReviewCommands
from oncewire.runs.review.recovery import UNAVAILABLE_SUMMARY, recovery_plan
from oncewire.runs.review.table import REVIEW

__all__ = ["REVIEW", "UNAVAILABLE_SUMMARY", "ReviewCommands", "recovery_plan"]
