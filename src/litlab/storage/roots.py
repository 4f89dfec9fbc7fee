"""Where a run's checkpoints, config copy and summary persist: ``<storage.root>/<run identity>/``, an
fsspec URL (credentials from the environment, never the config). ``check_storage`` runs before torch
loads; a write that fails during a run raises ``StorageFailed``, one line. docs/storage.md."""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import logging
import os
import secrets
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import get_protocol

from litlab.errors import EXIT_FAILED, LitlabError, error_chain, first_line, one_line

log = logging.getLogger("litlab")

TEMPORARY_SUFFIX = ".tmp"  # an interrupted atomic write leaves ``.<name>.<random>.tmp`` behind
_OBJECT_STORES = {"s3": ("s3", "s3a"), "gcs": ("gs", "gcs"), "azure": ("az", "abfs", "abfss")}
EXAMPLE_ROOTS = {"s3": "s3://bucket/prefix", "gcs": "gs://bucket/prefix", "azure": "az://container/prefix"}


class StorageError(ValueError):
    """A storage root that cannot be used; the message is one line naming the URL and the cause."""


class StorageFailed(LitlabError):
    """Storage stopped working during the run: a write failed (after its retries, for object stores)."""

    exit_code = EXIT_FAILED

    def __init__(self, root: str, what: str, cause: str) -> None:
        super().__init__(f"storage {root} failed while writing {what}: {cause}")
        self.root, self.what, self.cause = root, what, cause


# Roots that failed in this process: later writes to them are skipped, not retried again.
_FAILED_ROOTS: dict[str, StorageFailed] = {}


def failed_storage(url: str) -> StorageFailed | None:
    """The failure of the storage root ``url`` lives under, if one failed in this process."""
    for root, failure in _FAILED_ROOTS.items():
        if url == root or url.startswith(root.rstrip("/") + "/"):
            return failure
    return None


@contextlib.contextmanager
def writing(root: str, what: str, url: str | None = None) -> Iterator[None]:
    """A storage error of the block as ``StorageFailed`` (the root is remembered as failed); others pass."""
    try:
        yield
    except StorageFailed:
        raise
    except Exception as error:
        if (cause := storage_cause(error, url or root)) is None:
            raise
        failure = StorageFailed(root, what, cause)
        _FAILED_ROOTS[root] = failure
        raise failure from error


def storage_cause(error: BaseException, url: str, checked: Mapping[str, Any] | None = None) -> str | None:
    """Why a storage operation on ``url`` failed, in words. During the run, None for errors that are
    not the storage's (a checkpoint that cannot be pickled, say); for a check (``checked``: its
    filesystem's options, one try), any error of an object store."""
    # torch.save reports a full disk as a RuntimeError raised while handling the file's OSError.
    os_error = next((e for e in error_chain(error) if isinstance(e, OSError) and e.errno is not None), None)
    protocol, attempts = get_protocol(url), None
    if protocol == "file":
        if os_error is None:
            return None
        reason = os.strerror(os_error.errno).lower()
        if os_error.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"{reason} (errno {errno.errorcode[os_error.errno]})"
        return f"{reason} ({os_error.filename or url})"
    if checked is None:  # the run's filesystem: fsspec's options for the protocol (use_storage_options)
        if not _names(*error_chain(error)) & _REMOTE_ERRORS and os_error is None:
            return None
        checked = fsspec.config.conf.get(protocol, {})
        attempts = checked.get("config_kwargs", {}).get("retries", {}).get("total_max_attempts")
        attempts = attempts or checked.get("max_attempts")  # GCS and Azure classes take it as it is
    unreachable = [e for e in error_chain(error) if _names(e) & _UNREACHABLE]
    if unreachable:
        endpoint = _endpoint(protocol, checked)
        tries = f" after {attempts} attempts" if attempts else ""
        said = next((e for e in unreachable if str(e)), unreachable[0])  # fsspec's timeout says nothing
        return f"{endpoint} did not answer{tries} ({type(said).__name__}: {one_line(said)})"
    return _answered(error, url)


def _answered(error: BaseException, url: str) -> str:
    """An object store's error other than silence, in words: a refusal, no credentials, no bucket."""
    names = _names(error)
    message = one_line(error)
    status = getattr(error, "status_code", None)  # azure-core's HttpResponseError: its status and code
    if "HttpResponseError" in names and status:  # (its message goes on with the XML answer)
        code = getattr(error, "error_code", None)
        message = f"{status} {getattr(code, 'value', code) or first_line(error)}"
    if "HttpError" in names and getattr(error, "code", None):  # gcsfs's: "<message>, <status>"
        status = error.code  # type: ignore[attr-defined]
        message = f"{status} {str(error).rpartition(', ')[0]}".strip()
    if "AzureSigningError" in names:  # the SDK cannot sign with the key (binascii's words hold none of it)
        key = "AZURE_STORAGE_ACCOUNT_KEY"
        if os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):  # adlfs takes it first
            key = "the AccountKey in AZURE_STORAGE_CONNECTION_STRING"
        return f"{key} is not a valid account key, which is base64 ({message}): copy it again"
    # adlfs without a connection string or account name; Azure's credential chain finding none.
    chain_found_none = {"CredentialUnavailableError", "ClientAuthenticationError"} & names and not status
    no_azure_credentials = bool(chain_found_none) or (
        isinstance(error, ValueError) and "connection_string or account_name" in message
    )
    if "NoCredentialsError" in names or "DefaultCredentialsError" in names or no_azure_credentials:
        return (
            "no credentials found: set them in the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "or AWS_PROFILE; GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_CONNECTION_STRING or "
            "AZURE_STORAGE_ACCOUNT_NAME) or the provider's credential chain"
        )
    if isinstance(error, FileNotFoundError):
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        kind = "container" if get_protocol(url) in _OBJECT_STORES["azure"] else "bucket"
        return f"{kind} '{bucket}' does not exist ({message})"
    if isinstance(error, PermissionError) or status in (401, 403):
        return f"access denied, check the credentials in the environment ({message})"
    return f"{type(error).__name__}: {message}"


def storage_options(storage: Mapping[str, Any]) -> dict[str, Any]:
    """fsspec keyword arguments for the storage config's filesystem: endpoint and region (never keys)
    and the bounds of every request."""
    protocol = get_protocol(str(storage["root"]))
    attempts, timeout = int(storage.get("max_attempts", 5)), float(storage.get("timeout_s", 10.0))
    if protocol in _OBJECT_STORES["s3"]:
        client = {"endpoint_url": storage.get("endpoint_url"), "region_name": storage.get("region")}
        client = {k: v for k, v in client.items() if v}
        options: dict[str, Any] = {"client_kwargs": client} if client else {}
        # botocore's standard retry mode, each try failing after ``timeout`` s without progress (to
        # connect, between bytes received, sent bytes unacknowledged).
        config = {
            "connect_timeout": timeout,
            "read_timeout": timeout,
            "retries": {"mode": "standard", "total_max_attempts": attempts},
            "connector_args": {"socket_factory": functools.partial(socket_timing_out_stalled_sends, timeout)},
        }
        return {**options, "config_kwargs": config, "session": _session_without_expect_continue()}
    store = next((store for store, names in _OBJECT_STORES.items() if protocol in names), None)
    keys = {"gcs": ("endpoint_url", "project"), "azure": ("account_name", "endpoint_url")}.get(store, ())
    options = {key: storage[key] for key in keys if storage.get(key)}
    if store == "gcs" and os.environ.get("STORAGE_EMULATOR_HOST"):
        # An emulator, as Google's clients find it, and as they do, no credentials: gcsfs would
        # otherwise look for this machine's own (and a metadata server) and send them to it.
        options["token"] = "anon"
    return {**options, "max_attempts": attempts, "timeout_s": timeout} if keys else {}


# Each store's library and the class that bounds every request of its protocol, whatever URL it is for
# (the storage root, a checkpoint litlab-eval reads, resume=URL); each says what its library would do.
_BOUNDED_FILESYSTEMS = {
    "s3": ("s3fs", "litlab.storage.s3_retrying_once.S3FileSystemRetryingOnce"),
    "gcs": ("gcsfs", "litlab.storage.gcs_bounded.GCSFileSystemBounded"),
    "azure": ("adlfs", "litlab.storage.azure_blob.AzureBlobFileSystemBounded"),
}


def open_through_bounded_filesystems() -> None:
    """fsspec opens every object store's URLs with its class in ``_BOUNDED_FILESYSTEMS``: by name, so its
    library is imported only when used, or as a class where fsspec has the library's own already."""
    for store, (library, class_path) in _BOUNDED_FILESYSTEMS.items():
        needs = f"{store} storage needs {library}: pip install 'litlab[{store}]'"
        for name in _OBJECT_STORES[store]:
            if name in fsspec.registry:
                module, _, cls = class_path.rpartition(".")
                bounded = getattr(importlib.import_module(module), cls)
                fsspec.register_implementation(name, bounded, clobber=True)
            else:
                fsspec.register_implementation(name, class_path, clobber=True, errtxt=needs)


open_through_bounded_filesystems()


def use_storage_options(root: str, options: Mapping[str, Any]) -> None:
    """Make every fsspec filesystem of the root's protocol in this process use ``options``: Lightning
    opens checkpoint URLs without storage options, so fsspec's per-protocol config carries them."""
    protocol = get_protocol(root)
    if options:
        fsspec.config.conf.setdefault(protocol, {}).update(options)
    open_through_bounded_filesystems()  # again: a library imported since may have taken the protocol


def socket_timing_out_stalled_sends(timeout: float, addr_info: tuple) -> socket.socket:
    """A socket for aiohttp that the kernel drops when sent bytes stay unacknowledged for ``timeout``
    (a server that stopped answering mid-upload), which aiohttp's own timeouts do not cover."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    if hasattr(socket, "TCP_USER_TIMEOUT") and family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(timeout * 1000))
    return sock


@functools.cache
def _session_without_expect_continue() -> Any:
    """An aiobotocore session whose uploads do not ask for "100 Continue", which aiohttp awaits forever."""
    from aiobotocore.session import AioSession
    from botocore.handlers import add_expect_header

    session = AioSession()
    session.unregister("before-call.s3", add_expect_header)
    return session


class RunStorage:
    """The storage folder of one run identity."""

    def __init__(self, root: str, identity: str, options: Mapping[str, Any] | None = None) -> None:
        self.root = str(root).rstrip("/")
        self.identity = identity
        self.options = dict(options or {})  # for the folders beside this one (a code version's)
        self.url = f"{self.root}/{identity}"
        self.fs, self.path = fsspec.core.url_to_fs(self.url, **self.options)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    @property
    def checkpoint_url(self) -> str:
        return f"{self.url}/checkpoints"

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    def prepare(self) -> None:
        self.fs.makedirs(f"{self.path}/checkpoints", exist_ok=True)

    def write_text(self, name: str, text: str) -> None:
        """Write ``<storage folder>/name`` (locally atomic). Raises StorageFailed; skipped, with a
        warning, once this storage failed in this process."""
        failure = failed_storage(self.url)
        if failure is not None:
            log.warning("%s not written: the storage failed earlier (%s)", self.url_of(name), failure.cause)
            return
        target = f"{self.path}/{name}"
        with writing(self.url, name, self.url_of(name)):
            if self.is_local:
                write_text_atomic(Path(target), text)
            else:
                self.fs.pipe_file(target, text.encode())

    def read_text(self, name: str) -> str | None:
        """``<storage folder>/name``, or None when it does not exist."""
        try:
            return self.fs.cat_file(f"{self.path}/{name}").decode()
        except FileNotFoundError:
            return None

    def url_of_path(self, path: str) -> str:
        """The URL of a path of ``fs``, in the root's scheme (adlfs's unstrip_protocol writes abfs:// for az://)."""
        return path if self.is_local else f"{get_protocol(self.root)}://{path.lstrip('/')}"


def copy_changed_files(files: list[Path], destination: str, root: str) -> None:
    """Copy the files whose size differs from their copy in ``destination`` (a folder's URL under the
    storage root ``root``) into it. Raises StorageFailed; skipped once the root failed."""
    if failed_storage(destination) is not None or not files:
        return
    with writing(root, destination.removeprefix(root).lstrip("/") + "/", destination):
        fs, remote = fsspec.core.url_to_fs(destination)
        try:
            sizes = {e["name"].rsplit("/", 1)[-1]: e["size"] for e in fs.ls(remote, detail=True)}
        except FileNotFoundError:
            sizes = {}
            fs.makedirs(remote, exist_ok=True)  # a local or mounted root has real folders
        for path in files:
            if sizes.get(path.name) != path.stat().st_size:
                fs.put_file(str(path), f"{remote}/{path.name}")


def write_atomic(
    path: Path, write: Callable[[IO[bytes]], Any], durable: bool = False, exclusive: bool = False
) -> None:
    """The engine's one atomic write: ``write(file)`` (binary) into a temporary file, then a rename, so a
    full disk or a kill never truncates ``path``. ``durable``: synced to disk too (checkpoints);
    ``exclusive``: FileExistsError where ``path`` exists (a lock, created whole and only once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        (os.link if exclusive else os.replace)(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # a link's, or a failed write's
    if durable:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda file: file.write(text.encode()))


# --- the fail-fast check -------------------------------------------------------------------------

# Names of exceptions (botocore, aiohttp, asyncio, fsspec, azure-core) that mean the endpoint did not answer.
_UNREACHABLE = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
    "ClientConnectorError",
    "ServerTimeoutError",
    "TimeoutError",
    "FSTimeoutError",
    "ConnectionRefusedError",
    "ServiceRequestError",
    "ServiceResponseError",
}
# Errors of an object store's request: azure-core's; gcsfs's HttpError for a status (5xx, 429).
_REMOTE_ERRORS = _UNREACHABLE | {"ClientError", "HTTPClientError", "BotoCoreError", "NoCredentialsError"}
_REMOTE_ERRORS |= {"AzureError", "HttpError"}


def check_storage(storage: Mapping[str, Any]) -> None:
    """Fail in seconds, before training, when the storage root cannot hold checkpoints: a local root
    must be a writable directory (a mounted one must exist already); an object store gets a probe
    object written and deleted, with short timeouts and no retries. Raises StorageError (one line)."""
    name, root = storage.get("name", "local"), str(storage["root"])
    protocol = get_protocol(root)
    expected = _OBJECT_STORES.get(name, ("file",))
    if protocol not in expected:
        example = EXAMPLE_ROOTS.get(name, "/path/on/the/drive")
        raise StorageError(f"storage={name} needs storage.root={example}, got storage.root={root}")
    if protocol == "file":
        _check_local(root, create=bool(storage.get("create_root", True)))
    else:
        timeout = float(storage.get("check_timeout_s", 2.0))
        _check_remote(root, _fail_fast(storage, timeout), timeout)


def check_checkpoint_exists(url: str, storage: Mapping[str, Any]) -> None:
    """``resume=PATH`` names an existing file (on the storage root's backend when it is a URL)."""
    protocol, options = get_protocol(url), {}
    try:
        if protocol == "file":
            found = Path(url.removeprefix("file://")).expanduser().is_file()
        else:
            same = protocol == get_protocol(str(storage["root"]))  # else the storage's endpoint is not its
            timeout = float(storage.get("check_timeout_s", 2))
            options = _fail_fast({**(storage if same else {}), "root": url}, timeout)
            found = fsspec.get_filesystem_class(protocol)(**options).isfile(url)
    except Exception as error:
        cause = one_line(error) if protocol == "file" else storage_cause(error, url, options)
        raise StorageError(f"resume={url} cannot be checked: {cause}") from None
    if not found:
        raise StorageError(
            f"resume={url}: no checkpoint there; use resume=auto, resume=never or a .ckpt path"
        )


def _check_local(root: str, create: bool) -> None:
    path = Path(root.removeprefix("file://")).expanduser()
    if not path.exists():
        if not create:
            raise StorageError(
                f"storage root {root} does not exist: mount the drive there first (storage=mounted "
                "never creates its root, so checkpoints cannot land on a disk that disappears)"
            )
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StorageError(f"storage root {root} cannot be created: {error.strerror}") from None
    if not path.is_dir():
        raise StorageError(f"storage root {root} is not a directory")
    try:
        tempfile.TemporaryFile(dir=path).close()
    except OSError as error:
        raise StorageError(f"storage root {root} is not writable: {error.strerror}") from None


def _check_remote(root: str, options: dict[str, Any], timeout: float) -> None:
    endpoint = _endpoint(get_protocol(root), options)
    try:
        filesystem_class = fsspec.get_filesystem_class(get_protocol(root))
    except ImportError as error:
        raise StorageError(f"storage root {root} needs a package that is not installed: {error}") from None
    failure: list[BaseException] = []

    def probe() -> None:
        try:
            fs = filesystem_class(**options)
            folder = fsspec.core.strip_protocol(root)
            # First a request without a body: aiohttp waits without a timeout for the "100 Continue"
            # that botocore asks for on uploads, so an endpoint that never answers would hang there.
            fs.info(folder.split("/", 1)[0])
            probe_path = f"{folder}/.litlab-write-check-{secrets.token_hex(4)}"
            fs.pipe_file(probe_path, b"")
            fs.rm_file(probe_path)
        except BaseException as error:  # reported below, in the main thread
            failure.append(error)

    # A daemon thread with a deadline: no library hang can keep the check past a few timeouts.
    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout=2 * timeout + 1)
    if worker.is_alive():
        raise StorageError(f"storage root {root} is not usable: {endpoint} did not answer in {timeout:g} s")
    if failure:
        raise StorageError(f"storage root {root} is not usable: {storage_cause(failure[0], root, options)}")


def _fail_fast(storage: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Options of a filesystem for a check: one try of each request, each failing after ``timeout``."""
    return {
        **storage_options({**storage, "max_attempts": 1, "timeout_s": timeout}),
        "skip_instance_cache": True,
    }


def _endpoint(protocol: str, options: Mapping[str, Any]) -> str:
    if protocol in _OBJECT_STORES["s3"]:
        configured = options.get("client_kwargs", {}).get("endpoint_url")
        env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return f"endpoint {configured or env}" if configured or env else "the AWS S3 endpoint"
    if protocol in _OBJECT_STORES["azure"]:  # from the connection string, never the string: it holds the key
        connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
        parts = dict(part.split("=", 1) for part in connection.split(";") if "=" in part)
        account = options.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        account, suffix = parts.get("AccountName", account), parts.get("EndpointSuffix", "core.windows.net")
        configured = options.get("endpoint_url") or parts.get("BlobEndpoint")
        configured = configured or (account and f"https://{account}.blob.{suffix}")
        return f"endpoint {configured}" if configured else "the Azure blob endpoint"
    configured = options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
    return f"endpoint {configured}" if configured else "the GCS endpoint"


def _names(*errors: BaseException) -> set[str]:
    return {cls.__name__ for error in errors for cls in type(error).__mro__}
