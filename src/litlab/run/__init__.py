"""One run: its parts built (build, combinations, loggers), fitted (oom), ended and recorded (lifecycle,
summary, doctor, ending), its ranks watched and failing together (hangs, failures); a sweep's record of
its jobs (sweep_record).
"""
