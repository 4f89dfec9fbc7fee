"""Where checkpoints persist (roots), how they are written (checkpoints), and the resume decision (resume)."""
