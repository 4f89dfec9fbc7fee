"""Configs before anything runs: the engine's schema and rules, your groups' signatures, the torch-free
train check (preflight); a run's identity and code version (identity); credentials redacted from what is
written or logged (redact); the resolvers, the ``--help`` group list and Optuna's pruner settings."""
