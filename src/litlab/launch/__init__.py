"""Who starts the ranks (ranks), sweep jobs as processes of their own (multirun), and the default
launcher's pool of devices (pool)."""
