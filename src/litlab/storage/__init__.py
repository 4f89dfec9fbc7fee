"""Where checkpoints persist (roots), how they are written (checkpoints), the resume decision (resume),
one process per run identity (lock), and each object store's bounded filesystem."""
