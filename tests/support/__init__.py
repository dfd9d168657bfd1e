"""What the tests share beyond fixtures: where the PostgreSQL server is (:mod:`.pg`) and a
run-ledger database read and edited around oncewire on either backend (:mod:`.runs_db`), and
code run under a given recursion limit (:mod:`.recursion`). Also the fake Discord (REST API,
:mod:`.discord_api`, with its Gateway, :mod:`.discord_api_gateway`, and how a call is read,
:mod:`.discord_calls`): a wire fake only the tests run, so it is not in the package beside
the ones in :mod:`oncewire.testing` that the lab and the demo run too."""
