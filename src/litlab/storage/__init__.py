"""Where checkpoints persist (roots), how they are written (checkpoints), the resume decision (resume),
one process per run identity (lock), and the S3 filesystem that tries each request once
(s3_retrying_once).
"""
