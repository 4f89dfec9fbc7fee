"""Nothing is lost when a run dies: real ``litlab-train`` processes stopped and run again.

Every test runs the same command as one uninterrupted run (computed once per module) and requires
the interrupted-then-resumed run to resume from the newest valid checkpoint (its step known in
advance from where the run was stopped) and to end with a final checkpoint whose weights, optimizer,
scheduler and random generator states are bitwise equal to the uninterrupted run's.

Runs are stopped at exact points by ``tests.faults.SignalAt`` (a callback the command adds; it
signals its own process at a given step and phase), not by racing the progress log. The one random
point is drawn from ``TEST_SEED`` (printed in pytest's header and in every message about it;
``LITLAB_TEST_SEED=<seed>`` replays it).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import signal
import socket
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import FAULTS_IMPORTABLE, TEST_SEED, litlab, ok, run_dirs, start_litlab, summary
from tests.faults import PHASES, SIGNAL_AT_ENV
from tests.image_files import write_image_folder

pytestmark = pytest.mark.slow

EPOCHS, BATCHES = 2, 10
TOTAL_STEPS = EPOCHS * BATCHES
CHECKPOINT_EVERY = 2
# Several epochs of small batches with a schedule, checkpoints every 2 steps, TensorBoard every step.
ARGS = [
    f"trainer.max_epochs={EPOCHS}",
    f"trainer.limit_train_batches={BATCHES}",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_model_summary=false",
    "trainer.deterministic=true",
    "trainer.log_every_n_steps=1",
    "data.batch_size=32",
    "scheduler=cosine",
    "test_after_fit=false",
    "logger=tensorboard",
    "callbacks.progress.every_n_steps=1",
    f"callbacks.checkpoint.every_n_train_steps={CHECKPOINT_EVERY}",
]
# The fault hook: idle unless $LITLAB_TEST_SIGNAL_AT names a point; it records the generators'
# states in every checkpoint. Part of every command here, so it is part of the run identity of all.
SIGNAL_HOOK = "+callbacks.signal_at._target_=tests.faults.SignalAt"
HOOKED = [*ARGS, SIGNAL_HOOK]
# Per-step curves; epoch means of training metrics are left out: Lightning does not checkpoint their
# running sums, so in the epoch a run resumed in they average the batches after the restart only.
CURVES = ("train/loss_step", "lr-AdamW", "val/loss", "val/acc")
RESUMING = re.compile(r"resuming from (\S+) \(epoch (\d+), step (\d+)\)")
# For tests that draw kill points (other modules' too): seeded, so a failure can be replayed.
KILL_POINTS = random.Random(TEST_SEED)


@dataclass
class Outcome:
    log_dir: Path
    state: dict[str, Any]  # model, optimizer, scheduler and generator states of the final last.ckpt
    curves: dict[str, dict[int, float]]
    last_bytes: bytes  # the final last.ckpt as written


@dataclass(frozen=True)
class Stop:
    """Where a run is stopped: ``signal`` sent by its own SignalAt at ``phase`` of ``step``."""

    signal: str
    phase: str
    step: int

    def __post_init__(self) -> None:
        assert self.phase in PHASES, self.phase

    def env(self) -> dict[str, str]:
        return {SIGNAL_AT_ENV: f"{self.signal}:{self.phase}:{self.step}"}

    @property
    def exit_status(self) -> int:
        return -signal.SIGKILL if self.signal == "SIGKILL" else 128 + signal.SIGTERM

    def newest_checkpoint_step(self) -> int:
        """The step of the newest checkpoint once stopped here (0: none yet), from the schedule alone.

        SIGTERM saves preempted.ckpt at the step it stopped (after the epoch's validation where it
        came at an epoch's end). SIGKILL leaves the last step-multiple of CHECKPOINT_EVERY whose
        checkpoint was written: at train_batch_start the previous step's is; at train_batch_end and
        during a write the step's own is not (yet); during an epoch-end validation neither is (an
        epoch's last batch has no step checkpoint: the epoch-end one follows its validation).
        """
        if self.signal == "SIGTERM":
            return self.step
        done = self.step - (0 if self.phase == "train_batch_start" else 1)
        return done // CHECKPOINT_EVERY * CHECKPOINT_EVERY

    def __str__(self) -> str:
        return f"{self.signal} at {self.phase} of step {self.step}"


def env_for(log_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**FAULTS_IMPORTABLE, "LITLAB_LOG_DIR": str(log_dir), **(extra or {})}


def final_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What a resumed run must end with exactly: weights, optimizer, scheduler and, where the
    SignalAt hook recorded them, the random generators' states."""
    state = {
        "weights": checkpoint["state_dict"],
        "optimizer": checkpoint["optimizer_states"],
        "scheduler": checkpoint["lr_schedulers"],
    }
    if "tests.faults" in checkpoint:
        state["rng"] = checkpoint["tests.faults"]["rng"]
    return state


def storage_folder(log_dir: Path) -> Path:
    """The run's folder, its storage folder too (not one that ``resume=never`` moved aside)."""
    (folder,) = run_dirs(log_dir)
    return folder


def local_last_checkpoint(log_dir: Path) -> dict[str, Any]:
    return torch.load(storage_folder(log_dir) / "checkpoints" / "last.ckpt", weights_only=True)


def recorded_tensorboard_dir(log_dir: Path) -> Path:
    """The TensorBoard log directory the run identity continues (run.json names it)."""
    record = json.loads((storage_folder(log_dir) / "run.json").read_text())
    return Path(record["tensorboard_dir"])


def curves(log_dir: Path, tensorboard_dir: Path | None = None) -> dict[str, dict[int, float]]:
    """TensorBoard scalars of the run's log directory (the only one under log_dir unless named), as
    TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if tensorboard_dir is None:
        folders = sorted({p.parent for p in log_dir.glob("train/runs/*/tensorboard/events.out.tfevents.*")})
        assert len(folders) == 1, f"one TensorBoard log directory expected, found {folders}"
        tensorboard_dir = folders[0]
    events = EventAccumulator(str(tensorboard_dir), size_guidance={"scalars": 0})
    events.Reload()  # purges what a killed process logged past the step its successor resumed from
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in CURVES}


def assert_same_tensors(expected: Any, actual: Any, where: str = "") -> None:
    if isinstance(expected, torch.Tensor):
        assert torch.equal(expected, actual), f"{where} differs"
    elif isinstance(expected, dict):
        assert expected.keys() == actual.keys(), where
        for key in expected:
            assert_same_tensors(expected[key], actual[key], f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(actual), where
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            assert_same_tensors(a, b, f"{where}[{i}]")
    else:
        assert expected == actual, where


def assert_ends_as_uninterrupted(uninterrupted: Outcome, log_dir: Path, where: str) -> None:
    state = final_state(local_last_checkpoint(log_dir))
    assert state.keys() == {"weights", "optimizer", "scheduler", "rng"}, "the SignalAt hook ran"
    assert_same_tensors(uninterrupted.state, state, where)


def stop_at(stop: Stop, log_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """``litlab-train`` (HOOKED and ``args``), stopped by its own SignalAt at ``stop``."""
    result = litlab("litlab-train", *HOOKED, *args, env=env_for(log_dir, stop.env()))
    assert result.returncode == stop.exit_status, (
        f"{stop}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
    )
    return result


def interrupt_at(
    step: int, sig: signal.Signals, env: dict[str, str], *args: str, send: Any = None
) -> tuple[int, str]:
    """Start litlab-train, send ``sig`` once its progress log shows ``step``, return (status, output).
    ``send(process, sig)`` picks whom to signal (default: the process, i.e. Lightning's launching one).

    For signals from outside the process (to other ranks, from a launcher); a point inside one
    process is exact with ``stop_at``."""
    # Its own session and process group, for a signal to every rank.
    process = start_litlab("litlab-train", *ARGS, *args, env=env, new_session=True)
    seen = []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        reached = re.search(r"\] epoch \d+(?:/\d+)? step (\d+):", line)
        if reached and int(reached.group(1)) >= step:
            (send or type(process).send_signal)(process, sig)
            break
    seen.append(process.stdout.read())
    process.wait(timeout=120)
    output = "".join(seen)
    assert reached and int(reached.group(1)) >= step, f"the run ended before step {step}:\n{output[-3000:]}"
    return process.returncode, output


def resumed_from(output: str) -> tuple[str, int, int]:
    lines = [m for m in RESUMING.finditer(output)]
    assert len(lines) == 1, f"expected one 'resuming from' line:\n{output[-3000:]}"
    url, epoch, step = lines[0].groups()
    return url, int(epoch), int(step)


def valid_checkpoints(folder: Path) -> dict[Path, int]:
    """Every checkpoint file in ``folder`` that torch's safe loading reads, with its global step."""
    steps = {}
    for path in folder.glob("*.ckpt"):
        try:
            steps[path] = int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])
        except (RuntimeError, EOFError, ValueError, KeyError, pickle.UnpicklingError, zipfile.BadZipFile):
            continue
    return steps


def assert_resumed_from_the_newest_valid(output: str, valid: dict[Path, int], step: int, where: str) -> Path:
    """The run resumed from a checkpoint at ``step``, which is the newest valid one on disk then."""
    url, _, resumed_step = resumed_from(output)
    assert max(valid.values()) == step, f"{where}: newest valid checkpoint on disk {valid}, expected {step}"
    assert resumed_step == step and Path(url) in valid and valid[Path(url)] == step, (
        f"{where}: resumed from {url} at step {resumed_step}; valid checkpoints {valid}"
    )
    return Path(url)


def random_step(low: int = 4, high: int = TOTAL_STEPS - 6) -> int:
    """A step drawn from the module's seeded generator (TEST_SEED)."""
    return KILL_POINTS.randint(low, high)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    log_dir = tmp_path_factory.mktemp("uninterrupted") / "logs"
    ok(litlab("litlab-train", *HOOKED, env=env_for(log_dir)))
    last = storage_folder(log_dir) / "checkpoints" / "last.ckpt"
    return Outcome(log_dir, final_state(local_last_checkpoint(log_dir)), curves(log_dir), last.read_bytes())


def random_stop_in_the_last_epoch() -> Stop:
    """A SIGKILL at a phase and step of the last epoch, drawn with TEST_SEED."""
    points = [("train_batch_start", step) for step in range(BATCHES, TOTAL_STEPS)]  # before batch step+1
    points += [("train_batch_end", step) for step in range(BATCHES + 1, TOTAL_STEPS + 1)]
    points += [("checkpoint_write", step) for step in range(BATCHES + 2, TOTAL_STEPS + 1, CHECKPOINT_EVERY)]
    points += [("validation", TOTAL_STEPS)]
    phase, step = KILL_POINTS.choice(points)
    return Stop("SIGKILL", phase, step)


def test_a_run_stopped_at_every_edge_resumes_from_the_newest_valid_checkpoint_and_ends_bitwise_equal(
    uninterrupted, tmp_path
):
    """One run identity, stopped six times at exact points, each start resuming the previous one;
    the last start completes."""
    log_dir = tmp_path / "logs"
    checkpoints = lambda: storage_folder(log_dir) / "checkpoints"  # noqa: E731  (made by the first start)
    drawn = random_stop_in_the_last_epoch()
    where = f"random point {drawn} (TEST_SEED={TEST_SEED})"
    print(where)

    # 1. The first step, before any checkpoint: the next start begins from scratch.
    stop_at(Stop("SIGKILL", "train_batch_end", 1), log_dir)
    assert valid_checkpoints(checkpoints()) == {}
    # 2. Half of last.ckpt written mid-epoch at step 4: the real name never holds the half file.
    start = stop_at(Stop("SIGKILL", "checkpoint_write", 4), log_dir)
    assert not RESUMING.search(start.stdout), start.stdout[-2000:]
    (temporary,) = checkpoints().glob(".last.ckpt.*.tmp")
    assert temporary.stat().st_size > 0
    assert valid_checkpoints(checkpoints()) == {checkpoints() / "last.ckpt": 2}
    # 3. Just after the checkpoint of step 6 (before step 7's batch).
    valid = valid_checkpoints(checkpoints())
    start = stop_at(Stop("SIGKILL", "train_batch_start", 6), log_dir)
    assert_resumed_from_the_newest_valid(start.stdout, valid, 2, "after the half-written checkpoint")
    assert f"resume: removed {temporary}, left by a write that was interrupted" in start.stdout
    assert not temporary.exists()
    # 4. SIGTERM mid-epoch, between two checkpoints: preempted.ckpt at that step, exit 143, interrupted.
    valid = valid_checkpoints(checkpoints())
    start = stop_at(Stop("SIGTERM", "train_batch_end", 7), log_dir)
    assert_resumed_from_the_newest_valid(start.stdout, valid, 6, "just after a checkpoint")
    preempted = checkpoints() / "preempted.ckpt"
    assert valid_checkpoints(checkpoints())[preempted] == 7
    assert json.loads((storage_folder(log_dir) / "summary.json").read_text())["status"] == "interrupted"
    # 5. Just after the epoch-end checkpoints, before the second epoch's first batch; resumed from
    # preempted.ckpt (the newest file), through the first epoch's validation.
    valid = valid_checkpoints(checkpoints())
    start = stop_at(Stop("SIGKILL", "train_batch_start", BATCHES), log_dir)
    url = assert_resumed_from_the_newest_valid(start.stdout, valid, 7, "after SIGTERM")
    assert url == preempted
    epoch_end = checkpoints() / f"epoch_000-step_{BATCHES:06d}.ckpt"
    assert valid_checkpoints(checkpoints())[epoch_end] == BATCHES
    # 6. The drawn point of the last epoch.
    valid = valid_checkpoints(checkpoints())
    start = stop_at(drawn, log_dir)
    assert_resumed_from_the_newest_valid(start.stdout, valid, BATCHES, "at the epoch boundary")
    valid = valid_checkpoints(checkpoints())
    assert max(valid.values()) == drawn.newest_checkpoint_step(), f"{where}: {valid}"
    # Then the newest file is truncated (as a disk that lost its tail): the last start skips it.
    newest = max(checkpoints().glob("*.ckpt"), key=os.path.getmtime)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    valid.pop(newest)

    final = ok(litlab("litlab-train", *HOOKED, env=env_for(log_dir)))
    skipped = [line for line in final.stdout.splitlines() if "WARNING" in line and "skipping" in line]
    assert len(skipped) == 1 and str(newest) in skipped[0], final.stdout[-3000:]
    assert_resumed_from_the_newest_valid(final.stdout, valid, max(valid.values()), f"truncated, {where}")

    assert_ends_as_uninterrupted(uninterrupted, log_dir, where)
    outcome = summary(run_dirs(log_dir)[-1])
    assert (outcome["status"], outcome["resumed_count"], outcome["global_step"]) == (
        "completed",
        5,
        TOTAL_STEPS,
    )
    record = json.loads((storage_folder(log_dir) / "run.json").read_text())
    resumed_steps = [s["global_step"] for s in record["starts"]]
    assert resumed_steps == [None, None, 2, 6, 7, BATCHES, max(valid.values())], resumed_steps
    assert not preempted.exists(), "a run that finished removes its stale preemption checkpoint"
    # The same TensorBoard run continues across every start that resumed.
    tensorboard = recorded_tensorboard_dir(log_dir)
    assert tensorboard == storage_folder(log_dir) / "tensorboard"  # in the run's one folder
    assert summary(run_dirs(log_dir)[-1])["tensorboard_dir"] == str(tensorboard)  # where the curves are
    assert curves(log_dir, tensorboard) == uninterrupted.curves, where


def test_a_run_stopped_during_validation_resumes_and_runs_that_validation(uninterrupted, tmp_path):
    """A stop during an epoch's validation never loses it: SIGTERM lets it finish (and its epoch-end
    checkpoints) before preempted.ckpt; after a SIGKILL, the resume replays the epoch's last batches
    from the checkpoint before them and validates (no checkpoint is written on an epoch's last batch,
    which Lightning would resume straight into the next epoch)."""
    log_dir = tmp_path / "logs"
    checkpoints = lambda: storage_folder(log_dir) / "checkpoints"  # noqa: E731  (made by the first start)
    term = Stop("SIGTERM", "validation", BATCHES)
    stop_at(term, log_dir)
    valid = valid_checkpoints(checkpoints())
    assert valid[checkpoints() / "preempted.ckpt"] == BATCHES
    assert valid[checkpoints() / f"epoch_000-step_{BATCHES:06d}.ckpt"] == BATCHES  # validation finished
    kill = Stop("SIGKILL", "validation", TOTAL_STEPS)
    start = stop_at(kill, log_dir)
    assert_resumed_from_the_newest_valid(start.stdout, valid, term.newest_checkpoint_step(), str(term))
    valid = valid_checkpoints(checkpoints())
    assert max(valid.values()) == kill.newest_checkpoint_step() == TOTAL_STEPS - CHECKPOINT_EVERY, valid
    final = ok(litlab("litlab-train", *HOOKED, env=env_for(log_dir)))
    assert_resumed_from_the_newest_valid(final.stdout, valid, kill.newest_checkpoint_step(), str(kill))
    assert_ends_as_uninterrupted(uninterrupted, log_dir, str(kill))
    assert curves(log_dir, recorded_tensorboard_dir(log_dir)) == uninterrupted.curves, str(kill)


def test_completed_run_is_not_trained_again_and_resume_never_starts_fresh(uninterrupted):
    log_dir = uninterrupted.log_dir
    folder = storage_folder(log_dir)
    last = folder / "checkpoints" / "last.ckpt"
    written = last.stat().st_mtime_ns

    again = ok(litlab("litlab-train", *HOOKED, env=env_for(log_dir)))
    message = [line for line in again.stdout.splitlines() if "already completed" in line]
    assert len(message) == 1 and "resume=never" in message[0] and "run_name" in message[0]
    assert last.stat().st_mtime_ns == written
    # The new run directory shows the finished run's outcome (a rerun sweep's report reads it).
    assert summary(run_dirs(log_dir)[-1]) == json.loads((folder / "summary.json").read_text())

    fresh = ok(litlab("litlab-train", *HOOKED, "resume=never", env=env_for(log_dir)))
    assert "resuming from" not in fresh.stdout
    (moved_aside,) = list((log_dir / "train" / "runs").glob(f"{folder.name}.replaced-*"))
    assert (moved_aside / "checkpoints" / "last.ckpt").read_bytes() == uninterrupted.last_bytes
    assert summary(run_dirs(log_dir)[-1])["resumed_count"] == 0
    record = json.loads((storage_folder(log_dir) / "run.json").read_text())
    assert [s["resumed_from"] for s in record["starts"]] == [None]  # a new record: one fresh start
    # Deterministic training: the fresh run ends where the first one did.
    assert_ends_as_uninterrupted(uninterrupted, log_dir, "resume=never")


def test_object_store_run_killed_on_one_machine_resumes_on_another_and_leaks_no_credentials(
    uninterrupted, object_store, tmp_path
):
    """On every object store (storage=s3, storage=gcs, storage=azure): checkpoints land whole in the
    bucket; a run killed on one machine leaves its lock there, and the same command on a machine with
    an empty disk takes it over, resumes from the newest checkpoint with the uninterrupted run's
    weights, and releases it; summary.json names the checkpoints' URL; no credential is in any byte
    written."""
    bucket = object_store.create_bucket("resume")
    storage = object_store.storage(bucket, "runs")
    secrets = object_store.secrets
    first_machine, second_machine = tmp_path / "machine-1" / "logs", tmp_path / "machine-2" / "logs"

    stop = Stop("SIGKILL", "train_batch_end", 13)  # mid-epoch, its step 12 checkpoint uploaded
    litlab_env = env_for(first_machine, {**object_store.env(), **stop.env()})
    killed = litlab("litlab-train", *HOOKED, *storage, env=litlab_env)
    assert killed.returncode == stop.exit_status, killed.stdout[-3000:]
    assert_no_secrets(first_machine, object_store.objects(bucket), secrets)
    shutil.rmtree(first_machine)  # the machine and its disk are gone

    identity = storage_folder(uninterrupted.log_dir).name  # storage settings are not part of the identity
    prefix = f"runs/{identity}/checkpoints/"
    objects = object_store.objects(bucket)
    left = json.loads(objects[f"runs/{identity}.lock"])  # the killed run's lock, in the bucket
    assert left["host"] == socket.gethostname(), left
    step = lambda data: int(torch.load(_bytes_io(data), weights_only=True)["global_step"])  # noqa: E731
    uploaded = {
        f"{object_store.scheme}://{bucket}/{key}": step(data)
        for key, data in objects.items()
        if key.startswith(prefix) and key.endswith(".ckpt")
    }
    result = ok(litlab("litlab-train", *HOOKED, *storage, env=env_for(second_machine, object_store.env())))
    url, _, resumed_step = resumed_from(result.stdout)
    assert resumed_step == stop.newest_checkpoint_step() == max(uploaded.values()), (url, uploaded)
    assert uploaded[url] == resumed_step
    objects = object_store.objects(bucket)
    assert f"runs/{identity}.lock" not in objects, "the lock, taken over from the killed run, is released"
    last = torch.load(_bytes_io(objects[f"{prefix}last.ckpt"]), weights_only=True)
    assert_same_tensors(uninterrupted.state, final_state(last), str(stop))
    (run,) = run_dirs(second_machine)
    outcome = summary(run)  # the local run directory says where the checkpoints are, in no file of its own
    checkpoints = f"{object_store.scheme}://{bucket}/runs/{identity}/checkpoints"
    assert outcome["checkpoints"]["dir"] == checkpoints
    assert outcome["resumed_count"] == 1 and not (run / "checkpoints").exists()
    assert f"(checkpoints: {checkpoints})" in result.stdout
    # TensorBoard files were copied to the bucket after each checkpoint and restored here. The step
    # just before the resume point may be missing (logged after its checkpoint, killed before the copy).
    restored, expected = curves(second_machine), uninterrupted.curves
    for tag, points in expected.items():
        missing = points.keys() - restored[tag].keys()
        assert missing <= {resumed_step - 1}, f"{tag}: steps {sorted(missing)} lost ({stop})"
        assert restored[tag] == {k: v for k, v in points.items() if k not in missing}, tag
    assert_no_secrets(second_machine, objects, secrets)


def _bytes_io(data: bytes):
    import io

    return io.BytesIO(data)


def assert_no_secrets(log_dir: Path, objects: dict[str, bytes], secrets: list[str]) -> None:
    """No credential in any file the run wrote: run directory, logs, config copies, checkpoints."""
    files = {str(p): p.read_bytes() for p in log_dir.rglob("*") if p.is_file()}
    files.update({f"object {key}": data for key, data in objects.items()})
    assert any(name.endswith(".ckpt") for name in files), "checkpoints are among the files searched"
    assert any(name.endswith("config.yaml") for name in files)
    for secret in secrets:
        leaked = [name for name, data in files.items() if secret.encode() in data]
        assert not leaked, f"a credential appears in {leaked}"


def test_a_run_reading_image_files_with_workers_and_random_augmentation_resumes_bitwise(tmp_path):
    # The engine's ResumableDataLoader: files read by 2 worker processes, a random flip per sample.
    root = write_image_folder(tmp_path / "images", classes=3, per_class=110, size=8)  # 232 train images
    files = [
        "data=image_folder",
        f"data.root={root}",
        "data.image_shape=[3,8,8]",
        "data.num_workers=2",
        "data.augment=[{_target_: torchvision.transforms.v2.RandomHorizontalFlip}]",
        "model=mlp",
    ]  # 8 batches of 32 an epoch (limit_train_batches is 10)
    alone = tmp_path / "alone"
    ok(litlab("litlab-train", *HOOKED, *files, env=env_for(alone)))
    log_dir = tmp_path / "logs"
    stop = Stop("SIGKILL", "train_batch_start", 12)  # the middle of the second epoch, after step 12's save
    stop_at(stop, log_dir, *files)
    result = ok(litlab("litlab-train", *HOOKED, *files, env=env_for(log_dir)))
    _, epoch, resumed_step = resumed_from(result.stdout)
    assert (epoch, resumed_step) == (1, stop.newest_checkpoint_step()), (epoch, resumed_step)
    assert summary(run_dirs(log_dir)[-1])["resume_exact"] is True
    expected = final_state(local_last_checkpoint(alone))
    assert "rng" in expected
    assert_same_tensors(expected, final_state(local_last_checkpoint(log_dir)), "image files")


def test_a_sigterm_within_an_accumulation_window_stops_at_its_step_and_resumes_bitwise_equal(tmp_path):
    """With accumulation, the batch in progress may leave gradients accumulated for a later step;
    no checkpoint holds them, so a stop there resumed into another run. The stop waits for the
    window's optimizer step."""
    accumulate = ["trainer.accumulate_grad_batches=2"]
    whole = tmp_path / "uninterrupted" / "logs"
    ok(litlab("litlab-train", *HOOKED, *accumulate, env=env_for(whole)))
    log_dir = tmp_path / "logs"
    stop_at(Stop("SIGTERM", "train_batch_start", 3), log_dir, *accumulate)  # the 4th window's first batch
    preempted = storage_folder(log_dir) / "checkpoints" / "preempted.ckpt"
    assert valid_checkpoints(preempted.parent)[preempted] == 4  # its second batch, then its step
    ok(litlab("litlab-train", *HOOKED, *accumulate, env=env_for(log_dir)))
    expected = final_state(local_last_checkpoint(whole))
    assert_ends_as_uninterrupted(Outcome(whole, expected, {}, b""), log_dir, "SIGTERM mid-window")
