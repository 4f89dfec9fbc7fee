"""litlab.library_internals against the installed Lightning and torch: each private attribute or
function it uses exists and does what the engine relies on, so an upgrade that changes one fails here."""

from __future__ import annotations

import datetime
import signal
import subprocess
import sys
import threading

import lightning as L
import pytest
import torch
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.plugins.environments import LightningEnvironment, SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litlab import library_internals as internals


def _trainer(tmp_path, **kwargs) -> L.Trainer:
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": tmp_path,
    }
    return L.Trainer(**{**options, **kwargs})


def test_foreach_norm_gives_each_tensors_norm_in_the_asked_dtype() -> None:
    tensors = [torch.tensor([3.0, 4.0], dtype=torch.bfloat16), torch.tensor([float("inf")])]
    norms = internals.foreach_norm(tensors, 2, dtype=torch.float32)
    assert [n.dtype for n in norms] == [torch.float32, torch.float32]
    assert norms[0].item() == 5.0 and norms[1].item() == float("inf")


def test_foreach_copy_copies_in_place() -> None:
    targets, sources = [torch.zeros(2), torch.zeros(3)], [torch.ones(2), torch.full((3,), 2.0)]
    kept = [t.data_ptr() for t in targets]
    internals.foreach_copy_(targets, sources)
    assert [t.tolist() for t in targets] == [[1.0, 1.0], [2.0, 2.0, 2.0]]
    assert [t.data_ptr() for t in targets] == kept


def test_format_summary_table_takes_totals_then_columns() -> None:
    table = internals.format_summary_table(
        10, 8, 0.04, {"train": 2, "eval": 0}, 0, (" ", ["0"]), ("Name", ["net"]), ("FLOPs", ["0"])
    )
    assert "net" in table and "FLOPs" in table and "Trainable params" in table


def test_default_store_is_the_one_the_group_was_created_with(tmp_path) -> None:
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        before = store.num_keys()
        default = internals.default_store()
        default.set("litlab/check", "seen")
        assert default.get("litlab/check") == b"seen"
        assert store.num_keys() == before + 1  # written through to the store the group was given
    finally:
        torch.distributed.destroy_process_group()


def test_default_backend_and_timeout_of_a_ddp_strategy() -> None:
    assert internals.default_process_group_backend(torch.device("cpu")) == "gloo"
    strategy = DDPStrategy(timeout=datetime.timedelta(seconds=42))
    assert internals.process_group_timeout(strategy) == datetime.timedelta(seconds=42)
    assert strategy.process_group_backend is None  # until the group is set up: the default applies


def _launcher_with(child: subprocess.Popen) -> _SubprocessScriptLauncher:
    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    launcher.procs.append(child)  # as its _call_children_scripts does for each rank it spawns
    return launcher


def test_an_observer_whose_children_were_taken_kills_nothing_when_a_child_failed() -> None:
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    failed.wait()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        launcher = _launcher_with(failed)
        # Lightning's observer of the launcher's children, with the bystander as its "main process".
        observer = _ChildProcessObserver(bystander.pid, child_processes=launcher.procs, sleep_period=1)
        observer.start()
        assert internals.take_child_processes(launcher) == [failed]
        assert launcher.procs == [failed]  # the launcher keeps them (its kill() on Ctrl+C)
        observer.join(timeout=30)
        assert not observer.is_alive()
        assert bystander.poll() is None, "the observer killed the process it watches over"
    finally:
        bystander.kill()
        bystander.wait()


def test_lightnings_launch_hands_its_observer_the_launchers_own_list(monkeypatch) -> None:
    # What take_child_processes relies on: launch() starts the observer on the launcher's `procs`
    # itself, not on a copy. The child here exits 0 when its stdin closes, so an observer that still
    # watches it (a Lightning that copies the list) ends without killing this process.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    launcher = _launcher_with(child)
    monkeypatch.setattr(launcher, "_call_children_scripts", lambda: None)  # the ranks: `child` stands in
    monkeypatch.delenv("LOCAL_RANK", raising=False)  # else the launcher takes its ranks as started elsewhere
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))  # else launch() sets this process's
    before = set(threading.enumerate())
    try:
        taken = launcher.launch(lambda: internals.take_child_processes(launcher))
        (observer,) = (t for t in set(threading.enumerate()) - before if isinstance(t, _ChildProcessObserver))
        assert taken == [child] and launcher.procs == [child]
        assert observer._child_processes == [], "Lightning's observer no longer watches the launcher's list"
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_an_armed_observer_kills_when_a_child_failed() -> None:
    """The other half: what disarming prevents still happens in this Lightning version."""
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    failed.wait()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    observer = _ChildProcessObserver(main_pid=bystander.pid, child_processes=[failed], sleep_period=0)
    observer.start()
    observer.join(timeout=30)
    assert bystander.wait(timeout=30) == -signal.SIGKILL


class _StopAtBatch(Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == self.batch:
            internals.raise_sigterm_after_this_batch(trainer)


def test_lightning_raises_sigterm_after_the_batch_in_progress(tmp_path) -> None:
    trainer = _trainer(tmp_path, max_steps=10, callbacks=[_StopAtBatch(2)])
    with pytest.raises(SIGTERMException):
        trainer.fit(BoringModel())
    assert trainer.global_step == 3  # the batch in progress finished, and no other began
    assert trainer.fit_loop.epoch_loop.batch_progress.total.completed == 3


class _Accumulating(Callback):
    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen.append(internals.accumulating(trainer))


def test_accumulating_is_true_within_a_window_and_false_at_its_step(tmp_path) -> None:
    seen = _Accumulating()
    _trainer(tmp_path, max_steps=2, accumulate_grad_batches=3, callbacks=[seen]).fit(BoringModel())
    assert seen.seen == [True, True, False] * 2


def test_cluster_environment_single_device_and_under_slurm(tmp_path, monkeypatch) -> None:
    assert isinstance(internals.cluster_environment(_trainer(tmp_path)), LightningEnvironment)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setenv("SLURM_NODELIST", "localhost")
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NODEID", "0")
    environment = internals.cluster_environment(_trainer(tmp_path))
    assert isinstance(environment, SLURMEnvironment) and environment.requeue_signal is not None


def test_last_global_step_saved(tmp_path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    assert internals.last_global_step_saved(checkpoint) == 0
    trainer = _trainer(tmp_path, max_steps=5, enable_checkpointing=True, callbacks=[checkpoint])
    trainer.fit(BoringModel())
    assert internals.last_global_step_saved(checkpoint) == 4  # every 2 steps


def test_wandb_run_started_is_false_until_the_experiment_is_touched(tmp_path) -> None:
    pytest.importorskip("wandb")
    logger = WandbLogger(save_dir=tmp_path, offline=True, mode="disabled")
    assert internals.wandb_run_started(logger) is False
    logger.experiment  # noqa: B018  (the property starts the run)
    assert internals.wandb_run_started(logger) is True


def test_hydra_job_callbacks_call_the_configs_callbacks_around_a_job() -> None:
    from omegaconf import OmegaConf

    calls = []
    config = OmegaConf.create({"hydra": {"callbacks": {"noted": {"_target_": f"{__name__}.NotedCallback"}}}})
    NotedCallback.calls = calls
    callbacks = internals.hydra_job_callbacks(config)
    callbacks.on_job_start(config=config, task_function=print)
    callbacks.on_job_end(config=config, job_return=None)
    assert calls == ["on_job_start", "on_job_end"]


class NotedCallback:
    calls: list[str] = []

    def on_job_start(self, config, **kwargs) -> None:
        self.calls.append("on_job_start")

    def on_job_end(self, config, job_return, **kwargs) -> None:
        self.calls.append("on_job_end")
