"""Config checks before anything runs: the engine's schema and rules, your groups' signatures,
the preflight."""
