"""Config checks before anything runs: the engine's schema and rules, your groups' signatures,
the torch-free train check (preflight); and the resolvers, the ``--help`` group list and Optuna's
pruner settings the configs use."""
