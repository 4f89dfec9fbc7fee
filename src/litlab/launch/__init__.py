"""Who starts the ranks (ranks), sweep jobs (multirun), and what a job that shares the sweep's
process puts back (isolation)."""
