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
    """gcsfs's JSON-API ``GCSFileSystem``, each request tried ``max_attempts`` times (gcsfs's retry and
    backoff), each try failing after ``timeout_s`` without progress. gcsfs fixes 6 tries at import and
    waits without a timeout; its default class since 2026 first asks a gRPC control plane for 60 s,
    which an emulator never answers. Zonal "Rapid" buckets need gRPC and are not supported."""

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
        """gcsfs's request ``method`` without its decorator's 6 tries, retried ``max_attempts`` times."""
        return retry_request(retries=self.max_attempts)(method.__wrapped__)
