"""Policy tests. A package, so that ``test_contract`` here (the policy conformance suite) and ``tests/job``'s
``test_contract`` (the job-side contract) can both be collected: pytest's default import mode names a module
outside a package by its file name alone."""
