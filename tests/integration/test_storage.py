"""Storage that cannot be used fails before training, fast, in one line; writes are atomic.

The failure cases run ``litlab-train`` for real against a missing or read-only folder, a real S3
server on 127.0.0.1 (moto) and an endpoint that accepts connections but never answers. Each command
must exit 2 with one stderr line naming the URL and the cause, before torch loads (what makes it
fast: PYTHONPROFILEIMPORTTIME lists what the process imported; the storage check's own probe has a
2 s timeout and no retries) and before any run directory exists, leaving earlier files untouched.
No wall-clock bound: ``HANG_GUARD_S`` only stops a command that hangs. The same check on every
object store (S3, GCS, Azure: tests.object_stores) is called in-process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from litlab.storage import lock, resume
from litlab.storage.checkpoints import AtomicCheckpointIO
from litlab.storage.roots import RunStorage, StorageError, check_storage, storage_options
from tests.conftest import compose_train, litlab, run_dirs

HANG_GUARD_S = 120  # a command that hangs fails the test instead of the suite
IMPORT_TIME = "import time:"  # the lines PYTHONPROFILEIMPORTTIME=1 writes to stderr, one per module


def litlab_checking_storage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``litlab-train`` with its imports listed on stderr (PYTHONPROFILEIMPORTTIME)."""
    listing = {**(env or {}), "PYTHONPROFILEIMPORTTIME": "1"}
    # Cold: a warm start's torch was imported before it began, and would not be listed.
    return litlab("litlab-train", *args, env=listing, timeout=HANG_GUARD_S, cold=True)


def fails_in_one_line(result: subprocess.CompletedProcess, *words: str) -> str:
    """Exit 2, one stderr line holding ``words``, no traceback, and torch never imported."""
    imported = {
        line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith(IMPORT_TIME)
    }
    stderr = "\n".join(line for line in result.stderr.splitlines() if not line.startswith(IMPORT_TIME))
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{stderr}"
    assert "litlab.cli" in imported and not {"torch", "lightning"} & imported, "failed before torch loads"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in result.stdout + stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """An existing directory this process cannot write to, holding an earlier run's file."""
    path = tmp_path / "drive"
    (path / "earlier-run").mkdir(parents=True)
    (path / "earlier-run" / "last.ckpt").write_bytes(b"earlier checkpoint")
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    # root ignores permission bits: make it a read-only mount of the same folder instead
    bind = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
    remount = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True)
    if bind.returncode or remount.returncode:
        if not bind.returncode:
            subprocess.run(["umount", str(path)], check=False)
        pytest.skip("running as root without the right to mount: no way to make a read-only directory")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_missing_mounted_drive_fails_before_training(log_dir, tmp_path):
    root = tmp_path / "drive-not-mounted" / "litlab"
    result = litlab_checking_storage("storage=mounted", f"storage.root={root}")
    fails_in_one_line(result, str(root), "does not exist")
    assert not root.exists(), "a mounted root must never be created"
    assert not run_dirs(log_dir)


def test_read_only_mounted_drive_fails_and_keeps_earlier_files(log_dir, read_only_dir):
    before = snapshot(read_only_dir)
    result = litlab_checking_storage("storage=mounted", f"storage.root={read_only_dir}")
    fails_in_one_line(result, str(read_only_dir), "not writable")
    assert snapshot(read_only_dir) == before
    assert not run_dirs(log_dir)


def test_local_root_that_cannot_be_created_fails(log_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    root = blocker / "storage"
    result = litlab_checking_storage(f"storage.root={root}")
    fails_in_one_line(result, str(root), "cannot be created")
    assert blocker.read_text() == "not a directory"


def test_s3_root_without_a_root_url_says_what_to_pass(log_dir):
    result = litlab_checking_storage("storage=s3")
    fails_in_one_line(result, "storage=s3", "storage.root=s3://")


def test_s3_missing_bucket_fails_before_training(log_dir, s3_server):
    result = litlab_checking_storage(
        "storage=s3",
        "storage.root=s3://no-such-bucket/litlab",
        f"storage.endpoint_url={s3_server.endpoint}",
        env=s3_server.env(),
    )
    fails_in_one_line(result, "s3://no-such-bucket/litlab", "bucket 'no-such-bucket' does not exist")
    assert not run_dirs(log_dir)


def test_s3_bad_credentials_fail_and_keep_earlier_objects(log_dir, s3_server):
    bucket = s3_server.create_bucket("bad-credentials")
    s3_server.client().put_object(Bucket=bucket, Key="litlab/earlier/last.ckpt", Body=b"earlier")
    env = {**s3_server.env(), "AWS_ACCESS_KEY_ID": "AKIANOTAREALKEY00000", "AWS_SECRET_ACCESS_KEY": "wrong"}
    env["AWS_ENDPOINT_URL_S3"] = s3_server.endpoint  # the endpoint from the standard variable this time
    result = litlab_checking_storage("storage=s3", f"storage.root=s3://{bucket}/litlab", env=env)
    line = fails_in_one_line(result, f"s3://{bucket}/litlab", "access denied")
    assert "wrong" not in line
    assert s3_server.objects(bucket) == {"litlab/earlier/last.ckpt": b"earlier"}


def test_s3_endpoint_that_never_answers_fails_in_one_line_before_torch_loads(log_dir, s3_server):
    # A listening socket that never accepts: connections hang, as with a firewalled endpoint.
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(16)
        endpoint = f"http://127.0.0.1:{black_hole.getsockname()[1]}"
        result = litlab_checking_storage(
            "storage=s3",
            "storage.root=s3://ckpts/litlab",
            f"storage.endpoint_url={endpoint}",
            env=s3_server.env(),
        )
    fails_in_one_line(result, "s3://ckpts/litlab", endpoint, "did not answer")
    assert not run_dirs(log_dir)


def test_resume_from_a_missing_checkpoint_fails_in_one_line(log_dir, tmp_path):
    missing = tmp_path / "nowhere" / "last.ckpt"
    result = litlab_checking_storage(f"resume={missing}")
    fails_in_one_line(result, f"resume={missing}", "resume=auto", "resume=never")


def test_atomic_checkpoint_write_keeps_the_old_file_when_the_write_fails(tmp_path):
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full, say")

    target = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1, "weights": torch.ones(3)}, target)
    with pytest.raises(RuntimeError, match="disk full"):
        io.save_checkpoint({"step": 2, "weights": torch.zeros(3), "bad": Unpicklable()}, target)
    assert torch.load(target, weights_only=True)["step"] == 1
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"], "no temporary file left behind"


def test_checkpoints_are_listed_newest_first_and_temporaries_removed(tmp_path):
    storage = RunStorage(str(tmp_path), "run")
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for age, name in enumerate(["last.ckpt", "epoch=001-step=000040.ckpt", "epoch=000-step=000020.ckpt"]):
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (1_000_000 - age, 1_000_000 - age))
    (folder / ".last.ckpt.abc123.tmp").write_bytes(b"half a checkpoint")
    names = [Path(url).name for url in resume.checkpoints(storage)]
    assert names == ["last.ckpt", "epoch=001-step=000040.ckpt", "epoch=000-step=000020.ckpt"]
    assert resume.remove_temporaries(storage) == [str(folder / ".last.ckpt.abc123.tmp")]
    assert not (folder / ".last.ckpt.abc123.tmp").exists()


def storage_config(object_store, tmp_path: Path, bucket: str, prefix: str, *overrides: str) -> dict:
    """The storage config of a run stored under ``<scheme>://bucket/prefix`` on ``object_store``, as
    litlab-train composes it."""
    cfg = compose_train([*object_store.storage(bucket, prefix), *overrides], tmp_path)
    return OmegaConf.to_container(cfg.storage, resolve=True)


def test_object_store_the_folder_of_a_code_version_is_found_among_its_siblings(
    object_store, monkeypatch, tmp_path
):
    """litlab.storage.resume.find lists the identity's later versions in a bucket as on disk:
    after a code change, an unfinished later version is continued, else this code's own folder."""
    for name, value in object_store.env().items():
        monkeypatch.setenv(name, value)
    config = storage_config(object_store, tmp_path, object_store.create_bucket("versions"), "runs")
    root, options = config["root"], storage_options(config)
    code = {letter: {"fingerprint": letter * 40, "files": {"project/module.py": letter}} for letter in "abc"}
    base = RunStorage(root, "default-0123456789", options)
    resume.record_start(base, resume.Decision(code=code["a"]), Path("run-dir"))
    base.write_text("summary.json", json.dumps({"status": "completed"}))
    assert resume.find("auto", base, code["a"]).folder.identity == base.identity
    named = resume.find("auto", base, code["b"]).folder.identity
    assert named.startswith("default-0123456789-") and named != base.identity
    later = RunStorage(root, named, options)
    resume.record_start(later, resume.Decision(code=code["b"]), Path("run-dir"))  # then killed
    assert resume.find("auto", base, code["c"]).folder.identity == later.identity
    assert resume.find("never", base, code["c"]).folder.identity not in (base.identity, later.identity)


def test_object_store_check_names_a_missing_bucket_an_endpoint_that_never_answers_and_a_held_lock(
    object_store, monkeypatch, tmp_path
):
    """The check before training, in-process, on every object store (the processes above prove, on
    S3, that it runs before torch loads): one line for a missing bucket and for an endpoint that
    accepts connections but never answers; the preflight's lock check reads a lock in the bucket."""
    for name, value in object_store.env().items():
        monkeypatch.setenv(name, value)

    def storage(bucket: str, prefix: str, *overrides: str) -> dict:
        return storage_config(object_store, tmp_path, bucket, prefix, *overrides)

    kind = "container" if object_store.name == "azure" else "bucket"
    with pytest.raises(StorageError) as missing:
        check_storage(storage("no-such-bucket", "litlab"))
    root = f"{object_store.scheme}://no-such-bucket/litlab"
    expected = f"storage root {root} is not usable: {kind} 'no-such-bucket' does not exist"
    assert str(missing.value).startswith(expected), missing.value

    # A listening socket that never accepts: connections hang, as with a firewalled endpoint.
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(16)
        endpoint = f"http://127.0.0.1:{black_hole.getsockname()[1]}"
        with pytest.raises(StorageError) as unreachable:
            check_storage(
                storage("ckpts", "litlab", f"storage.endpoint_url={endpoint}", "storage.check_timeout_s=0.5")
            )
    assert f"endpoint {endpoint} did not answer" in str(unreachable.value), unreachable.value

    # A lock held by a live process (the server's, on this host), as a run's start leaves it.
    config = storage(object_store.create_bucket("locked"), "runs")
    run = RunStorage(config["root"], "default-0123456789", storage_options(config))
    holder = {"host": socket.gethostname(), "pid": object_store.pid, "started": "now", "token": "x"}
    run.fs.pipe_file(
        f"{run.path}{lock.LOCK_SUFFIX}", json.dumps({**holder, "heartbeat": time.time()}).encode()
    )
    with pytest.raises(
        StorageError, match=rf"is already running: {run.url}\.lock is held by pid {holder['pid']}"
    ):
        lock.check_not_locked(run)


def test_object_store_a_run_resumed_from_another_runs_checkpoint_leaves_that_run_alone(
    object_store, monkeypatch, tmp_path
):
    """``resume=<run A's last.ckpt URL> run_name=B trainer.max_epochs=2``, the documented "a finished
    run with more epochs", in-process on every object store: run B writes its own checkpoints and
    run A's objects stay byte for byte (Lightning's ModelCheckpoint restores A's file as its best and
    deletes a non-local one at its first save)."""
    from tests.conftest import TINY, train_in_process

    for name, value in object_store.env().items():
        monkeypatch.setenv(name, value)
    bucket = object_store.create_bucket("another")
    run = [*TINY, *object_store.storage(bucket, "runs"), "model=mlp", "logger=none", "test_after_fit=false"]
    train_in_process(tmp_path, *run, "run_name=runA", name="a")
    run_a = {key: data for key, data in object_store.objects(bucket).items() if key.startswith("runs/runA/")}
    assert "runs/runA/checkpoints/last.ckpt" in run_a
    url = f"{object_store.scheme}://{bucket}/runs/runA/checkpoints/last.ckpt"
    more = train_in_process(
        tmp_path, *run, "run_name=runB", "trainer.max_epochs=2", f"resume={url}", name="b"
    )
    assert more["status"] == "completed" and more["epochs"] == 2
    objects = object_store.objects(bucket)
    assert {key: data for key, data in objects.items() if key.startswith("runs/runA/")} == run_a
    assert "runs/runB/checkpoints/last.ckpt" in objects
