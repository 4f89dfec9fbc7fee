"""One run: build its parts (build, combinations, loggers), fit with out-of-memory handling (oom), its
life and outcome (lifecycle, summary, doctor), its ranks failing together (failures) and each rank's
one watch for dead peers, hangs and SIGTERM (hangs), how a failing run ends in one line (ending), and a
sweep's record of its jobs (sweep_record).
"""
