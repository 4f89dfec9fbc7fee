"""adlfs's filesystem with every request bounded (``litlab.storage.roots`` registers it for the azure
protocols). Credentials stay adlfs's: AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME
(or ``account_name``) with Azure's DefaultAzureCredential chain."""

from __future__ import annotations

import functools
import logging
from typing import Any

import aiohttp
from adlfs import AzureBlobFileSystem
from azure.core.pipeline.transport import AioHttpTransport

from litlab.storage.roots import socket_timing_out_stalled_sends

# The SDK logs every request and answer at INFO, a dozen lines per checkpoint; the credential chain
# warns in 15 lines when it finds no credential, which litlab's one line says (roots.storage_cause).
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)
logging.getLogger("azure.identity").setLevel(logging.ERROR)


class AzureBlobFileSystemBounded(AzureBlobFileSystem):
    """adlfs's blob client has the SDK's defaults whatever it is given (4 tries of 60 s, 15 s + 3**n s
    apart; an upload to a server that stopped reading waits forever). This one tries each request
    ``max_attempts`` times (the SDK's ExponentialRetry, 1 + 2**n s apart, +-1 s), each failing after
    ``timeout_s`` without progress. ``endpoint_url``: the blob service URL (null: the credentials')."""

    def __init__(
        self,
        *args: Any,
        max_attempts: int = 5,
        timeout_s: float = 10.0,
        endpoint_url: str | None = None,
        **kwargs: Any,
    ) -> None:
        # max_attempts tries of every request (each of the SDK's counters allows them all), each failing
        # after timeout_s to connect, between bytes received, or with sent bytes unacknowledged.
        counters = ("retry_total", "retry_connect", "retry_read", "retry_status")
        backoff = {"initial_backoff": 1, "increment_base": 2, "random_jitter_range": 1}
        transport = _TransportTimingOutStalledSends(timeout_s)
        self._client_config = {**dict.fromkeys(counters, max_attempts - 1), **backoff, "transport": transport}
        self._endpoint_url = endpoint_url
        super().__init__(*args, **kwargs)

    def do_connect(self) -> None:
        super().do_connect()  # adlfs's choice of credential: its client is rebuilt with the same one
        built = self.service_client
        url = self._endpoint_url or built.url
        self.service_client = type(built)(url, credential=built.credential, **self._client_config)

    async def _ls(self, path: str, detail: bool = False, refresh: bool = False, **kwargs: Any) -> Any:
        # fsspec's word for a listing read afresh is refresh (litlab's listings of checkpoints and of
        # sibling folders say it); adlfs's is invalidate_cache, and it ignores refresh.
        if refresh:
            kwargs["invalidate_cache"] = True
        return await super()._ls(path, detail=detail, **kwargs)


class _TransportTimingOutStalledSends(AioHttpTransport):
    """azure-core's aiohttp transport with sockets that time out unacknowledged sends, which its read
    timeout does not cover (an upload to a server that stopped reading)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(connection_timeout=timeout, read_timeout=timeout)
        self._timeout = timeout

    async def open(self) -> None:
        # Here (aiohttp needs the running loop), on the first open only: a closed transport stays closed.
        if self.session is None and self._session_owner and not self._has_been_opened:
            factory = functools.partial(socket_timing_out_stalled_sends, self._timeout)
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(socket_factory=factory),
                trust_env=self._use_env_settings,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
            )
        await super().open()
