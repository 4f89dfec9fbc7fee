"""Where checkpoints persist (roots), how they are written (checkpoints), the resume decision (resume),
and one process per run identity (lock).
"""
