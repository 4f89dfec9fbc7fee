"""gcsfs's JSON-API filesystem with a bound on every request (``litlab.storage.roots``)."""

from __future__ import annotations

import functools
import logging
from typing import Any

import aiohttp
from gcsfs.core import GCSFileSystem
from gcsfs.retry import retry_request

from litlab.storage.roots import socket_timing_out_stalled_sends

# gcsfs logs a traceback for every request that fails for good, then raises its error, which litlab
# reports in one line (StorageFailed, StorageError): the traceback would only bury that line.
logging.getLogger("gcsfs").addFilter(lambda record: not record.exc_info)


class GCSFileSystemBounded(GCSFileSystem):
    """gcsfs's ``GCSFileSystem``, each request tried ``max_attempts`` times (gcsfs's retry of 5xx,
    429, 408 and connection errors, with its exponential backoff: 1, 2, 4, 8 s plus up to 1 s of
    jitter between tries), each try failing after ``timeout_s`` without progress (to connect,
    between bytes received, sent bytes unacknowledged).

    gcsfs fixes its 6 tries when its module loads and waits without any timeout by default (aiohttp's
    ``timeout=None``): a storage that stops answering hung the run. And gcsfs's default class since
    2026 (``ExtendedGcsFileSystem``) first asks a gRPC control plane for a bucket's layout, retried
    for 60 s whatever the settings here say and not remembered when it fails: against an emulator,
    which speaks only the JSON API, every operation with credentials (anonymous ones included)
    waited that long. This class is the JSON API alone, which standard and hierarchical-namespace
    buckets serve (zonal "Rapid" buckets need gRPC and are not supported)."""

    def __init__(self, *args: Any, max_attempts: int = 5, timeout_s: float = 10.0, **kwargs: Any) -> None:
        kwargs["requests_timeout"] = aiohttp.ClientTimeout(sock_connect=timeout_s, sock_read=timeout_s)
        super().__init__(*args, **kwargs)
        self.max_attempts, self.timeout_s = max_attempts, timeout_s

    async def _set_session(self) -> aiohttp.ClientSession:
        if self._session is None and "connector" not in self.session_kwargs:
            factory = functools.partial(socket_timing_out_stalled_sends, self.timeout_s)
            connector = aiohttp.TCPConnector(socket_factory=factory)  # made here: it needs the running loop
            self.session_kwargs = {**self.session_kwargs, "connector": connector}
        return await super()._set_session()

    async def _request(self, *args: Any, **kwargs: Any) -> Any:
        return await self._retried(GCSFileSystem._request)(self, *args, **kwargs)

    async def _get_file_request(self, *args: Any, **kwargs: Any) -> Any:
        return await self._retried(GCSFileSystem._get_file_request)(self, *args, **kwargs)

    async def _get_file_concurrent(self, *args: Any, **kwargs: Any) -> Any:
        # Undecorated: its requests (_info, _get_file_request) are retried already; gcsfs's 6 tries
        # around them would make a download to a dead endpoint take 6 times the bound.
        return await GCSFileSystem._get_file_concurrent.__wrapped__(self, *args, **kwargs)

    def _retried(self, method: Any) -> Any:
        """gcsfs's request ``method`` undecorated (its decorator's 6 tries), retried by the same
        decorator ``max_attempts`` times."""
        return retry_request(retries=self.max_attempts)(method.__wrapped__)
