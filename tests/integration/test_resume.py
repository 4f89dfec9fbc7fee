"""Nothing is lost when a run dies: real ``litlab-train`` processes killed and run again.

Every test runs the same command as one uninterrupted run (computed once per module) and requires
the interrupted-then-resumed run to end with bitwise-equal weights and optimizer state, and the same
TensorBoard curves. Kill points are drawn at random; the drawn step is in the assertion messages.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import BIN, REPO, litlab, ok, run_dirs, summary
from tests.image_files import write_image_folder

pytestmark = pytest.mark.slow

EPOCHS, BATCHES = 2, 10
TOTAL_STEPS = EPOCHS * BATCHES
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
    "callbacks.checkpoint.every_n_train_steps=2",
]
# Per-step curves; epoch means of training metrics are left out: Lightning does not checkpoint their
# running sums, so in the epoch a run resumed in they average the batches after the restart only.
CURVES = ("train/loss_step", "lr-AdamW", "val/loss", "val/acc")
RESUMING = re.compile(r"resuming from (\S+) \(epoch (\d+), step (\d+)\)")


@dataclass
class Outcome:
    log_dir: Path
    state: dict[str, Any]  # model and optimizer state of the final last.ckpt
    curves: dict[str, dict[int, float]]


def env_for(log_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"LITLAB_LOG_DIR": str(log_dir), **(extra or {})}


def final_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    return {"weights": checkpoint["state_dict"], "optimizer": checkpoint["optimizer_states"]}


def storage_folder(log_dir: Path) -> Path:
    """The storage folder of the run identity (not one that ``resume=never`` moved aside)."""
    (folder,) = [p for p in (log_dir / "storage").iterdir() if p.is_dir() and ".replaced-" not in p.name]
    return folder


def local_last_checkpoint(log_dir: Path) -> dict[str, Any]:
    return torch.load(storage_folder(log_dir) / "checkpoints" / "last.ckpt", weights_only=True)


def curves(log_dir: Path) -> dict[str, dict[int, float]]:
    """TensorBoard scalars of every run directory under log_dir, as TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = sorted({p.parent for p in log_dir.glob("train/runs/*/tensorboard/events.out.tfevents.*")})
    assert len(folders) == 1, f"one TensorBoard log directory expected, found {folders}"
    events = EventAccumulator(str(folders[0]), size_guidance={"scalars": 0})
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


def interrupt_at(
    step: int, sig: signal.Signals, env: dict[str, str], *args: str, send: Any = None
) -> tuple[int, str]:
    """Start litlab-train, send ``sig`` once its progress log shows ``step``, return (status, output).
    ``send(process, sig)`` picks whom to signal (default: the process, i.e. Lightning's launching one)."""
    process = subprocess.Popen(
        [str(BIN / "litlab-train"), *ARGS, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, for a signal to every rank
    )
    seen = []
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        reached = re.search(r"\] epoch \d+(?:/\d+)? step (\d+):", line)
        if reached and int(reached.group(1)) >= step:
            (send or subprocess.Popen.send_signal)(process, sig)
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


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    log_dir = tmp_path_factory.mktemp("uninterrupted") / "logs"
    ok(litlab("litlab-train", *ARGS, env=env_for(log_dir)))
    return Outcome(log_dir, final_state(local_last_checkpoint(log_dir)), curves(log_dir))


def random_step(low: int = 4, high: int = TOTAL_STEPS - 6) -> int:
    # From step 4: checkpoints come every 2 steps and a kill can land just before the one of the step
    # it saw logged, so at step 2 there may be no checkpoint yet (then the rerun rightly starts fresh).
    return random.Random().randint(low, high)


def test_sigkill_at_a_random_step_then_the_same_command_ends_bitwise_equal(uninterrupted, tmp_path):
    log_dir, step = tmp_path / "logs", random_step()
    status, _ = interrupt_at(step, signal.SIGKILL, env_for(log_dir))
    assert status == -signal.SIGKILL, f"kill at step {step}"

    result = ok(litlab("litlab-train", *ARGS, env=env_for(log_dir)))
    url, epoch, resumed_step = resumed_from(result.stdout)
    assert Path(url).parent == storage_folder(log_dir) / "checkpoints"
    # Checkpoints every 2 steps; the kill can land before the checkpoint of the step it saw logged.
    assert resumed_step >= step - 2, f"killed at step {step}, resumed from {resumed_step}"
    assert_same_tensors(uninterrupted.state, final_state(local_last_checkpoint(log_dir)), f"step {step}")

    first, second = run_dirs(log_dir)
    outcome = summary(second)
    assert (outcome["status"], outcome["resumed_count"], outcome["global_step"]) == (
        "completed",
        1,
        TOTAL_STEPS,
    )
    # The same TensorBoard run continues: the second run directory points at the first one's log.
    assert (second / "tensorboard.dir").read_text().strip() == str(first / "tensorboard")
    assert len(list((first / "tensorboard").glob("events.out.tfevents.*"))) >= 2  # one per process
    assert curves(log_dir) == uninterrupted.curves, f"kill at step {step}"
    record = json.loads((storage_folder(log_dir) / "run.json").read_text())
    assert [s["resumed_from"] for s in record["starts"]] == [None, url]


def test_sigterm_saves_a_checkpoint_exits_nonzero_and_the_next_run_resumes_from_it(uninterrupted, tmp_path):
    log_dir, step = tmp_path / "logs", random_step()
    status, output = interrupt_at(step, signal.SIGTERM, env_for(log_dir))
    assert status == 128 + signal.SIGTERM, f"SIGTERM at step {step}:\n{output[-2000:]}"
    preempted = storage_folder(log_dir) / "checkpoints" / "preempted.ckpt"
    assert preempted.is_file()
    stored = json.loads((storage_folder(log_dir) / "summary.json").read_text())
    assert stored["status"] == "interrupted"

    result = ok(litlab("litlab-train", *ARGS, env=env_for(log_dir)))
    url, _, resumed_step = resumed_from(result.stdout)
    assert Path(url) == preempted and resumed_step >= step
    assert_same_tensors(uninterrupted.state, final_state(local_last_checkpoint(log_dir)), f"step {step}")
    assert not preempted.exists(), "a run that finished removes its stale preemption checkpoint"


def test_sigterm_after_an_epochs_last_batch_resumes_at_the_next_epochs_first_batch(uninterrupted, tmp_path):
    # Preempted at the epoch boundary (the epoch's last batch is done, its validation or checkpoint is
    # not). With limit_train_batches the saved loader position (10 of 40 batches) is not at the
    # loader's end, and once resumed into the next epoch it skipped that epoch's first 10 batches.
    log_dir = tmp_path / "logs"
    status, _ = interrupt_at(BATCHES, signal.SIGTERM, env_for(log_dir))
    assert status == 128 + signal.SIGTERM
    result = ok(litlab("litlab-train", *ARGS, env=env_for(log_dir)))
    resumed_from(result.stdout)
    assert_same_tensors(uninterrupted.state, final_state(local_last_checkpoint(log_dir)), "epoch boundary")


def test_truncated_newest_checkpoint_is_skipped_for_the_previous_valid_one(uninterrupted, tmp_path):
    # Killed in the last epoch, so older checkpoints (the best of an earlier epoch) exist too.
    log_dir, step = tmp_path / "logs", random_step(low=BATCHES + 1)
    status, _ = interrupt_at(step, signal.SIGKILL, env_for(log_dir))
    assert status == -signal.SIGKILL
    checkpoints = sorted((storage_folder(log_dir) / "checkpoints").glob("*.ckpt"), key=os.path.getmtime)
    assert len(checkpoints) >= 2, checkpoints
    newest = checkpoints[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # killed mid-write

    result = ok(litlab("litlab-train", *ARGS, env=env_for(log_dir)))
    warnings = [line for line in result.stdout.splitlines() if "WARNING" in line and "skipping" in line]
    assert len(warnings) == 1 and str(newest) in warnings[0], result.stdout[-3000:]
    url, _, _ = resumed_from(result.stdout)
    assert Path(url) != newest and Path(url) in checkpoints
    assert_same_tensors(uninterrupted.state, final_state(local_last_checkpoint(log_dir)), f"step {step}")


def test_completed_run_is_not_trained_again_and_resume_never_starts_fresh(uninterrupted):
    log_dir = uninterrupted.log_dir
    folder = storage_folder(log_dir)
    last = folder / "checkpoints" / "last.ckpt"
    written = last.stat().st_mtime_ns

    again = ok(litlab("litlab-train", *ARGS, env=env_for(log_dir)))
    message = [line for line in again.stdout.splitlines() if "already completed" in line]
    assert len(message) == 1 and "resume=never" in message[0] and "run_name" in message[0]
    assert last.stat().st_mtime_ns == written
    # The new run directory shows the finished run's outcome (a rerun sweep's report reads it).
    assert summary(run_dirs(log_dir)[-1]) == json.loads((folder / "summary.json").read_text())

    fresh = ok(litlab("litlab-train", *ARGS, "resume=never", env=env_for(log_dir)))
    assert "resuming from" not in fresh.stdout
    (moved_aside,) = list((log_dir / "storage").glob(f"{folder.name}.replaced-*"))
    assert (moved_aside / "checkpoints" / "last.ckpt").is_file()
    assert summary(run_dirs(log_dir)[-1])["resumed_count"] == 0
    # Deterministic training: the fresh run ends where the first one did.
    assert_same_tensors(uninterrupted.state, final_state(local_last_checkpoint(log_dir)))


def test_s3_run_killed_on_one_machine_resumes_on_another_and_leaks_no_credentials(
    uninterrupted, s3_server, tmp_path
):
    bucket = s3_server.create_bucket("resume")
    storage = ["storage=s3", f"storage.root=s3://{bucket}/runs", f"storage.endpoint_url={s3_server.endpoint}"]
    secrets = [s3_server.access_key, s3_server.secret_key]
    first_machine, second_machine = tmp_path / "machine-1" / "logs", tmp_path / "machine-2" / "logs"

    step = random_step()
    status, _ = interrupt_at(step, signal.SIGKILL, env_for(first_machine, s3_server.env()), *storage)
    assert status == -signal.SIGKILL
    assert_no_secrets(first_machine, s3_server.objects(bucket), secrets)
    shutil.rmtree(first_machine)  # the machine and its disk are gone

    result = ok(litlab("litlab-train", *ARGS, *storage, env=env_for(second_machine, s3_server.env())))
    url, _, resumed_step = resumed_from(result.stdout)
    identity = storage_folder(uninterrupted.log_dir).name  # storage settings are not part of the identity
    assert url.startswith(f"s3://{bucket}/runs/{identity}/checkpoints/")
    objects = s3_server.objects(bucket)
    last = torch.load(_bytes_io(objects[f"runs/{identity}/checkpoints/last.ckpt"]), weights_only=True)
    assert_same_tensors(uninterrupted.state, final_state(last), f"step {step}")
    (run,) = run_dirs(second_machine)
    assert (run / "checkpoints.url").read_text().strip() == f"s3://{bucket}/runs/{identity}/checkpoints"
    assert summary(run)["resumed_count"] == 1
    # TensorBoard files were copied to the bucket after each checkpoint and restored here. The step
    # just before the resume point may be missing (logged after its checkpoint, killed before the copy).
    restored, expected = curves(second_machine), uninterrupted.curves
    for tag, points in expected.items():
        missing = points.keys() - restored[tag].keys()
        assert missing <= {resumed_step - 1}, f"{tag}: steps {sorted(missing)} lost (kill at step {step})"
        assert restored[tag] == {k: v for k, v in points.items() if k not in missing}, tag
    assert_no_secrets(second_machine, objects, secrets)


def _bytes_io(data: bytes):
    import io

    return io.BytesIO(data)


def assert_no_secrets(log_dir: Path, objects: dict[str, bytes], secrets: list[str]) -> None:
    """No credential in any file the run wrote: run directory, logs, config copies, checkpoints."""
    files = {str(p): p.read_bytes() for p in log_dir.rglob("*") if p.is_file()}
    files.update({f"s3 object {key}": data for key, data in objects.items()})
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
    ]
    args = [*ARGS, *files]  # 8 batches of 32 an epoch (limit_train_batches is 10)
    alone = tmp_path / "alone"
    ok(litlab("litlab-train", *args, env=env_for(alone)))
    log_dir, step = tmp_path / "logs", 12  # the middle of the second epoch
    status, _ = interrupt_at(step, signal.SIGKILL, env_for(log_dir), *files)  # ARGS come first there
    assert status == -signal.SIGKILL
    result = ok(litlab("litlab-train", *args, env=env_for(log_dir)))
    _, epoch, resumed_step = resumed_from(result.stdout)
    assert epoch == 1 and 8 < resumed_step <= step, (epoch, resumed_step)  # resumed mid-epoch
    assert summary(run_dirs(log_dir)[-1])["resume_exact"] is True
    assert_same_tensors(
        final_state(local_last_checkpoint(alone)), final_state(local_last_checkpoint(log_dir))
    )
