"""Where a run's checkpoints, config copy and summary persist: ``<storage.root>/<run identity>/``.

Roots are fsspec URLs (a local path, a mounted drive, ``s3://bucket/prefix``, ``gs://bucket/prefix``),
so every backend goes through one code path. The run directory keeps the logs; for a local root it
links ``checkpoints/`` to the storage folder, for a remote one it holds a ``checkpoints.url`` pointer.

Credentials are never part of the config: s3fs and gcsfs read them from the environment or the
provider's credential chain. Nothing here imports torch at module level, so ``check_storage`` runs
in the preflight, before torch loads and before any run directory exists.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

CHECKPOINT_SUFFIX = ".ckpt"
TEMPORARY_SUFFIX = ".tmp"  # an interrupted atomic write leaves ``.<name>.<random>.tmp`` behind
OBJECT_STORES = {"s3": ("s3", "s3a"), "gcs": ("gs", "gcs")}


class StorageError(ValueError):
    """A storage root that cannot be used; the message is one line naming the URL and the cause."""


def protocol_of(url: str) -> str:
    """``s3``, ``gs``, ... for a URL; ``file`` for a plain path."""
    return url.split("://", 1)[0] if "://" in url else "file"


def storage_options(storage: Mapping[str, Any]) -> dict[str, Any]:
    """fsspec keyword arguments for the storage config's filesystem: endpoint and region, never keys."""
    protocol = protocol_of(str(storage["root"]))
    if protocol in OBJECT_STORES["s3"]:
        client = {"endpoint_url": storage.get("endpoint_url"), "region_name": storage.get("region")}
        client = {k: v for k, v in client.items() if v}
        return {"client_kwargs": client} if client else {}
    if protocol in OBJECT_STORES["gcs"]:
        options = {"endpoint_url": storage.get("endpoint_url"), "project": storage.get("project")}
        return {k: v for k, v in options.items() if v}
    return {}


def use_storage_options(root: str, options: Mapping[str, Any]) -> None:
    """Make every fsspec filesystem of the root's protocol in this process use ``options``.

    Lightning's ModelCheckpoint and checkpoint loading open URLs through fsspec without storage
    options; fsspec's per-protocol config is how a configured endpoint reaches them.
    """
    if options:
        fsspec.config.conf.setdefault(protocol_of(root), {}).update(options)


class RunStorage:
    """The storage folder of one run identity."""

    def __init__(self, root: str, identity: str, options: Mapping[str, Any] | None = None) -> None:
        self.root = str(root).rstrip("/")
        self.identity = identity
        self.url = f"{self.root}/{identity}"
        self.fs, self.path = fsspec.core.url_to_fs(self.url, **dict(options or {}))

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
        """Write ``<storage folder>/name``; locally via a temporary file and a rename (atomic)."""
        target = f"{self.path}/{name}"
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

    def checkpoints(self) -> list[tuple[str, float]]:
        """``(url, modified time)`` of every checkpoint file, newest first."""
        try:
            entries = self.fs.ls(f"{self.path}/checkpoints", detail=True, refresh=True)
        except FileNotFoundError:
            return []
        found = [
            (e["name"] if self.is_local else self.fs.unstrip_protocol(e["name"]), _modified(e))
            for e in entries
            if e["type"] == "file" and e["name"].endswith(CHECKPOINT_SUFFIX)
        ]
        # Ties (object stores keep whole seconds): a preemption checkpoint, then last.ckpt, come first.
        rank = {"preempted.ckpt": 0, "last.ckpt": 1}
        return sorted(found, key=lambda f: (-f[1], rank.get(f[0].rsplit("/", 1)[-1], 2)))

    def remove_temporaries(self) -> list[str]:
        """Delete what interrupted atomic writes left in the checkpoint folder (local roots only)."""
        if not self.is_local:
            return []  # object stores publish an object only once its upload completed
        folder = Path(self.path) / "checkpoints"
        leftovers = [p for p in folder.glob(f".*{TEMPORARY_SUFFIX}") if p.is_file()]
        for path in leftovers:
            path.unlink(missing_ok=True)
        return [str(p) for p in leftovers]

    def has_files(self) -> bool:
        try:
            return bool(self.fs.find(self.path))
        except FileNotFoundError:
            return False

    def set_aside(self) -> str:
        """Move this folder to ``<identity>.replaced-<time>`` (nothing is deleted); returns its URL."""
        stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        target = f"{self.path}.replaced-{stamp}"
        self.fs.mv(self.path, target, recursive=True)
        return target if self.is_local else self.fs.unstrip_protocol(target)

    def upload_changed(self, local_dir: Path, name: str) -> None:
        """Copy files of ``local_dir`` whose size changed into ``<storage folder>/name/``."""
        remote = f"{self.path}/{name}"
        try:
            sizes = {e["name"].rsplit("/", 1)[-1]: e["size"] for e in self.fs.ls(remote, detail=True)}
        except FileNotFoundError:
            sizes = {}
        for path in sorted(p for p in local_dir.iterdir() if p.is_file()):
            if sizes.get(path.name) != path.stat().st_size:
                self.fs.put_file(str(path), f"{remote}/{path.name}")

    def download(self, name: str, local_dir: Path) -> int:
        """Copy the files of ``<storage folder>/name/`` into ``local_dir``; returns how many."""
        try:
            entries = [e for e in self.fs.ls(f"{self.path}/{name}", detail=True) if e["type"] == "file"]
        except FileNotFoundError:
            return 0
        local_dir.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            self.fs.get_file(entry["name"], str(local_dir / entry["name"].rsplit("/", 1)[-1]))
        return len(entries)

    def link_into(self, run_dir: Path) -> None:
        """Make ``<run dir>/checkpoints`` lead to this run's checkpoints."""
        link = run_dir / "checkpoints"
        if link.exists() or link.is_symlink():
            return
        if self.is_local:
            link.symlink_to(Path(self.path) / "checkpoints", target_is_directory=True)
        else:
            (run_dir / "checkpoints.url").write_text(self.checkpoint_url + "\n")


def _modified(entry: Mapping[str, Any]) -> float:
    """An fsspec ``ls`` entry's modification time as a POSIX timestamp, whatever the backend."""
    for key in ("mtime", "LastModified", "updated", "last_modified", "created"):
        value = entry.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, dt.datetime):
            return value.timestamp()
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_checkpoint(url: str) -> dict:
    """A checkpoint's contents, loaded safely (``weights_only=True``) from any fsspec URL."""
    import torch

    with fsspec.open(url, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)


# --- the fail-fast check -------------------------------------------------------------------------

# Names of exceptions (from botocore, aiohttp, asyncio, fsspec) that mean the endpoint did not answer.
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
}


def check_storage(storage: Mapping[str, Any], timeout_s: float | None = None) -> None:
    """Fail in seconds, before training, when the storage root cannot hold checkpoints.

    Local and mounted roots must be writable directories (a mounted root must already exist: a
    missing mount point means the drive is not mounted). Object-store roots get one probe object
    written and deleted, with short timeouts and no retries. Raises StorageError (one line).
    """
    name, root = storage.get("name", "local"), str(storage["root"])
    protocol = protocol_of(root)
    expected = OBJECT_STORES.get(name, ("file",))
    if protocol not in expected:
        example = {"s3": "s3://bucket/prefix", "gcs": "gs://bucket/prefix"}.get(name, "/path/on/the/drive")
        raise StorageError(f"storage={name} needs storage.root={example}, got storage.root={root}")
    if protocol == "file":
        _check_local(root, create=bool(storage.get("create_root", True)))
    else:
        timeout = float(timeout_s if timeout_s is not None else storage.get("check_timeout_s", 2.0))
        _check_remote(root, storage_options(storage), timeout)


def check_checkpoint_exists(url: str, storage: Mapping[str, Any]) -> None:
    """``resume=PATH`` names an existing file (on the storage root's backend when it is a URL)."""
    protocol = protocol_of(url)
    try:
        if protocol == "file":
            found = Path(url.removeprefix("file://")).expanduser().is_file()
        else:
            options = storage_options(storage) if protocol == protocol_of(str(storage["root"])) else {}
            fast = _fail_fast_options(protocol, float(storage.get("check_timeout_s", 2.0)))
            fs = fsspec.get_filesystem_class(protocol)(**options, **fast, skip_instance_cache=True)
            fs.retries = 1
            found = fs.isfile(url)
    except Exception as error:
        raise StorageError(f"resume={url} cannot be checked: {type(error).__name__}: {error}") from None
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
        fd, probe = tempfile.mkstemp(dir=path, prefix=".litlab-write-check-", suffix=TEMPORARY_SUFFIX)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise StorageError(f"storage root {root} is not writable: {error.strerror}") from None


def _check_remote(root: str, options: dict[str, Any], timeout: float) -> None:
    protocol = protocol_of(root)
    endpoint = _endpoint(protocol, options)
    try:
        filesystem_class = fsspec.get_filesystem_class(protocol)
    except ImportError as error:
        raise StorageError(f"storage root {root} needs a package that is not installed: {error}") from None
    failure: list[BaseException] = []

    def probe() -> None:
        try:
            fs = filesystem_class(
                **options, **_fail_fast_options(protocol, timeout), skip_instance_cache=True
            )
            fs.retries = 1  # s3fs and gcsfs retry failed requests 5-6 times with back-off by default
            folder = fs._strip_protocol(root)
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
        raise StorageError(f"storage root {root} is not usable: {_cause(failure[0], root, endpoint)}")


def _fail_fast_options(protocol: str, timeout: float) -> dict[str, Any]:
    if protocol in OBJECT_STORES["s3"]:
        retries = {"total_max_attempts": 1}
        return {"config_kwargs": {"connect_timeout": timeout, "read_timeout": timeout, "retries": retries}}
    if protocol in OBJECT_STORES["gcs"]:
        return {"requests_timeout": timeout}
    return {}


def _endpoint(protocol: str, options: Mapping[str, Any]) -> str:
    if protocol in OBJECT_STORES["s3"]:
        configured = options.get("client_kwargs", {}).get("endpoint_url")
        env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return f"endpoint {configured or env}" if configured or env else "the AWS S3 endpoint"
    configured = options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
    return f"endpoint {configured}" if configured else "the storage endpoint"


def _cause(error: BaseException, root: str, endpoint: str) -> str:
    names = {cls.__name__ for cls in type(error).__mro__}
    message = " ".join(str(error).split()) or type(error).__name__
    if "NoCredentialsError" in names or "DefaultCredentialsError" in names:
        return (
            "no credentials found: set them in the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "or AWS_PROFILE; GOOGLE_APPLICATION_CREDENTIALS) or the provider's credential chain"
        )
    if names & _UNREACHABLE:
        return f"{endpoint} is unreachable ({type(error).__name__}: {message})"
    if isinstance(error, FileNotFoundError):
        bucket = root.split("://", 1)[1].split("/", 1)[0]
        return f"bucket '{bucket}' does not exist ({message})"
    if isinstance(error, PermissionError):
        return f"access denied, check the credentials in the environment ({message})"
    return f"{type(error).__name__}: {message}"
