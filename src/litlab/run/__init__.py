"""One run: build its parts (build), fit with out-of-memory handling (oom), its life and
outcome (lifecycle, summary)."""
