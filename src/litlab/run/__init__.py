"""One run: build its parts (build, combinations, loggers), fit with out-of-memory handling (oom), its
life and outcome (lifecycle, summary, identity, doctor), its ranks failing together and its hangs
(failures, hangs), and how a failing run ends in one line (ending).
"""
