"""``python -m oncewire``: the same as the ``oncewire`` command."""

import sys

from oncewire.cli import main

sys.exit(main())
