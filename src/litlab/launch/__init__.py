"""Sweeps: the grid of a multirun planned before any job starts (grid), jobs as processes of their own
(multirun), the default launcher's pool of devices (pool), the Optuna search (search), and who
started this process's ranks (ranks)."""
