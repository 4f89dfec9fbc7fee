"""s3fs's filesystem with one try per request at its own level: botocore's standard retry mode,
which knows which errors are transient, is the one retry layer (``litlab.storage.roots``)."""

from __future__ import annotations

from s3fs import S3FileSystem


class S3FileSystemRetryingOnce(S3FileSystem):
    """s3fs retries a failed request 5 times on top of botocore's attempts (25 tries of a dead
    endpoint); this class, registered for the s3 protocols, tries once."""

    retries = 1
