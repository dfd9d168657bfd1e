"""What the tests share beyond fixtures: where the PostgreSQL server is (:mod:`.pg`) and a
run-ledger database read and edited around oncewire on either backend (:mod:`.runs_db`), and
code run under a given recursion limit (:mod:`.recursion`). The wire fakes, the fake Discord
among them, are in the package (:mod:`oncewire.testing`): the lab runs them too."""
