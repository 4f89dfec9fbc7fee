"""A grid sweep is planned whole before any job starts (``litlab.launch.grid``): a value that does not
compose, or two jobs that train differently but would share a run name or a folder, refuse it in one
line; jobs that train the same run run once; a sweep folder holds one sweep's record.

The sweeper runs in-process with Hydra's real config loader and a launcher that only records what it
was handed: what is under test is what reaches the launcher, and what the sweep folder holds.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from hydra._internal.callbacks import Callbacks
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.hydra_config import HydraConfig
from hydra.types import HydraContext, RunMode
from omegaconf import OmegaConf

from litlab.config import resolvers, schema
from litlab.config.identity import run_identity
from litlab.config.preflight import CONFIG_DIR
from litlab.errors import LitlabError
from litlab.launch.grid import GridSweeper
from litlab.launch.pool import DevicePoolLauncher, DeviceSchedule, QueuedJob
from litlab.report.callback import SweepReport
from litlab.report.collect import collect_runs
from litlab.report.compare import build_report
from litlab.run import sweep_record
from litlab.storage import lock
from litlab.storage.roots import RunStorage


class RecordingLauncher:
    """Hands nothing to any process: keeps the batches of job overrides it was given."""

    def __init__(self) -> None:
        self.batches: list[list[list[str]]] = []

    def launch(self, job_overrides, initial_job_idx: int) -> list:
        self.batches.append([list(o) for o in job_overrides])
        return []

    @property
    def jobs(self) -> list[list[str]]:
        return [job for batch in self.batches for job in batch]


@pytest.fixture(autouse=True)
def _logs(log_dir):
    """Every run folder the plan names lies in the test's own logs/ (LITLAB_LOG_DIR)."""


def grid(tmp_path: Path, *hydra_overrides: str, arguments: tuple[str, ...] = ()) -> GridSweeper:
    """The grid sweeper of ``litlab-train -m <hydra_overrides> <arguments>``, as Hydra sets it up
    (its sweep folder ``tmp_path/sweep``); ``sweep()`` then takes the command's task overrides."""
    schema.register()
    resolvers.register()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONFIG_DIR)))
    overrides = [f"hydra.sweep.dir={tmp_path / 'sweep'}", *hydra_overrides, *arguments]
    config = loader.load_configuration("train", overrides, run_mode=RunMode.MULTIRUN)
    HydraConfig.instance().set_config(config)
    sweeper = GridSweeper(config.hydra.sweeper.max_batch_size, config.hydra.sweeper.params)
    sweeper.hydra_context = HydraContext(config_loader=loader, callbacks=None)
    sweeper.config, sweeper.launcher = config, RecordingLauncher()
    return sweeper


def refusal(sweeper: GridSweeper, arguments: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as refused:
        sweeper.sweep(["model=mlp", *arguments])
    assert refused.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("litlab: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("hydra_overrides", "arguments", "colliding"),
    [
        # every job would write the one folder a single run's habit gives it
        (
            ["hydra.run.dir=${paths.log_dir}/mine"],
            ["precision=fp32,bf16"],
            ["precision=fp32", "precision=bf16"],
        ),
        # one run name for runs of different seeds: n=3 "± 0.0" from one run
        ([], ["seed=1,2,3", "run_name=foo"], ["seed=1", "seed=2"]),
        # a subdir that names two runs alike: four jobs, two folders
        (
            ["hydra.sweep.subdir=${precision.name}"],
            ["precision=fp32,bf16", "seed=21,22"],
            ["seed=21", "seed=22"],
        ),
    ],
)
def test_jobs_that_train_differently_never_share_a_folder_the_sweep_is_refused_before_any_job(
    tmp_path, capsys, hydra_overrides, arguments, colliding
):
    sweeper = grid(tmp_path, *hydra_overrides)
    line = refusal(sweeper, arguments, capsys)
    assert all(override in line for override in colliding), line
    assert "would share" in line and "run_name, hydra.run.dir and hydra.sweep.subdir" in line
    assert sweeper.launcher.jobs == []  # no job started
    assert not (tmp_path / "sweep").exists()  # and no sweep folder: nothing to mistake for a result


def test_jobs_that_train_the_same_run_run_once_and_the_record_says_which(tmp_path):
    sweeper = grid(tmp_path)
    sweeper.sweep(["model=mlp", "precision=fp32,bf16", "optimizer.lr=0.002,2e-3,0.01"])
    launched = sweeper.launcher.jobs
    assert [(j[1], j[2]) for j in launched] == [
        ("precision=fp32", "optimizer.lr=0.002"),
        ("precision=fp32", "optimizer.lr=0.01"),
        ("precision=bf16", "optimizer.lr=0.002"),
        ("precision=bf16", "optimizer.lr=0.01"),
    ]
    _, sweep = sweep_record.read(tmp_path / "sweep")
    assert [(run["overrides"][1:], run["same_as"]) for run in sweep["same_runs"]] == [
        (["precision=fp32", "optimizer.lr=0.002"], 0),
        (["precision=bf16", "optimizer.lr=0.002"], 2),
    ]


def test_one_value_spelled_two_ways_is_one_job(tmp_path):
    sweeper = grid(tmp_path)
    sweeper.sweep(["model=mlp", "optimizer.weight_decay=0,0.0,1e-2,0.01"])
    (zero, hundredth) = [job[1].partition("=")[2] for job in sweeper.launcher.jobs]
    assert float(zero) == 0 and float(hundredth) == 0.01


def test_a_value_that_does_not_compose_is_one_line_and_leaves_no_sweep_folder(tmp_path, capsys):
    sweeper = grid(tmp_path)
    line = refusal(sweeper, ["precision=fp32,fp61"], capsys)
    assert "'fp61' is not an option of group 'precision'" in line and "fp32" in line
    assert sweeper.launcher.jobs == [] and not (tmp_path / "sweep").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without GPUs")
def test_a_device_this_machine_lacks_is_refused_in_the_plan_as_a_single_run_refuses_it(tmp_path, capsys):
    """The README's sweep with trainer=gpu on a CPU machine: one line before any job, as
    ``litlab-train trainer=gpu`` alone gives, not every job failing in its own folder."""
    sweeper = grid(tmp_path)
    line = refusal(sweeper, ["trainer=gpu", "trainer.devices=1,2"], capsys)
    assert "trainer.accelerator=gpu trainer.devices=1 asks for 1 GPU(s) but this machine has 0" in line
    assert sweeper.launcher.jobs == [] and not (tmp_path / "sweep").exists()
    # A Slurm launcher's jobs run on the cluster's nodes: a login node without GPUs submits them.
    slurm = grid(tmp_path, "hydra/launcher=slurm")
    slurm.sweep(["model=mlp", "trainer=gpu", "trainer.devices=1,2"])
    assert len(slurm.launcher.jobs) == 2


def test_every_planned_job_is_in_the_record_before_the_first_starts(tmp_path):
    """A sweep killed after its first job used to report one run: the record held only jobs that ended."""
    sweeper = grid(tmp_path)
    sweeper.sweep(["model=mlp", "precision=fp32,bf16,fp16"])
    entries, _ = sweep_record.read(tmp_path / "sweep")
    plans = sweeper.plan(["model=mlp", "precision=fp32,bf16,fp16"])
    assert [(e["outcome"], e["summary"]["status"]) for e in entries] == [("planned", "not started")] * 3
    assert [e["summary"]["run_name"] for e in entries] == [plan.identity for plan in plans]
    assert [e["summary"]["groups"]["precision"] for e in entries] == ["fp32", "bf16", "fp16"]
    report = build_report(collect_runs([tmp_path / "sweep"]))
    assert [row["status"] for row in report.rows] == ["not started"] * 3 and report.run_count == 3


def test_a_sweep_folder_holds_one_sweep_and_the_same_sweep_again_keeps_its_record_and_files(
    tmp_path, capsys, monkeypatch
):
    """``hydra.sweep.subdir=${hydra.job.num}``, then the same command with ``hydra.sweep.dir=`` that
    folder (to finish what was left) used to delete the job folders, train.log and TensorBoard logs
    with them, and every earlier entry of the record."""
    sweep_dir = tmp_path / "sweep"
    first = grid(tmp_path, "hydra.sweep.subdir=${hydra.job.num}")
    first.sweep(["model=mlp", "precision=fp32,bf16"])
    # What job 0 left: its folder in the sweep's (its run's), and its entry, completed.
    (sweep_dir / "0" / "tensorboard").mkdir(parents=True)
    (sweep_dir / "0" / "train.log").write_text("trained\n")
    completed = {"status": "completed", "run_name": "a", "started_at": "2026-12-01T10:00:00"}
    sweep_record.write_job(
        sweep_dir, 0, sweep_record.TRAINED, completed, run_dir=sweep_dir / "0", overrides=[]
    )
    monkeypatch.setattr(sweep_record, "_STARTED", set())  # each command below is a process of its own

    other = grid(tmp_path, "hydra.sweep.subdir=${hydra.job.num}")
    at_exit = SweepReport()
    monkeypatch.setattr(atexit, "register", lambda *args: None)  # called below, as the process exits
    at_exit.on_multirun_start(
        OmegaConf.create({"task_name": "train", "hydra": {"sweep": {"dir": str(sweep_dir)}}})
    )
    line = refusal(other, ["trainer.accumulate_grad_batches=1,2"], capsys)
    assert f"hydra.sweep.dir={sweep_dir} holds another sweep (model=mlp precision=fp32,bf16)" in line
    at_exit._report_at_exit(sweep_dir)  # what runs as the refused process exits: no report of the other sweep
    assert other.launcher.jobs == [] and not (sweep_dir / "report.md").exists()

    again = grid(tmp_path, "hydra.sweep.subdir=${hydra.job.num}")
    again.sweep(["model=mlp", "precision=fp32,bf16"])
    assert len(again.launcher.jobs) == 2
    entries, _ = sweep_record.read(sweep_dir)
    assert [(e["outcome"], e["summary"]["status"]) for e in entries] == [
        ("trained", "completed"),  # kept until this attempt's job 0 replaces it
        ("planned", "not started"),
    ]
    assert (sweep_dir / "0" / "train.log").read_text() == "trained\n" and (
        sweep_dir / "0" / "tensorboard"
    ).is_dir()


def test_the_fixed_values_of_a_users_sweep_file_are_part_of_each_runs_identity(tmp_path):
    configs = tmp_path / "configs"
    (configs / "sweep").mkdir(parents=True)
    sweep_file = configs / "sweep" / "mysweep.yaml"

    def identities(max_epochs: int, batch_size: int) -> list[str]:
        sweep_file.write_text(
            "# @package _global_\nhydra:\n  mode: MULTIRUN\n  sweeper:\n    params:\n"
            "      precision: fp32,bf16\n"
            f"trainer:\n  max_epochs: {max_epochs}\ndata:\n  batch_size: {batch_size}\n"
        )
        searchpath = f"hydra.searchpath=[file://{configs}]"
        sweeper = grid(tmp_path, searchpath, arguments=("sweep=mysweep",))
        return [plan.identity for plan in sweeper.plan(["sweep=mysweep", "precision=fp32,bf16"])]

    before, after = identities(1, 32), identities(3, 128)
    assert len(set(before)) == 2 and not set(before) & set(after)  # edited: new runs, not "completed"
    assert identities(1, 32) == before


@contextlib.contextmanager
def held_by_another_process(root: Path, identity: str) -> Iterator[int]:
    """The lock of run ``identity`` in ``root``, held by a live process of this machine but not this
    one (another sweep's job, or the pool of another sweep that is about to start it); its pid."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(other.pid).create_time()
        holder = dataclasses.replace(lock.Holder.of_this_process(), pid=other.pid, process_started=started)
        lock._write(RunStorage(str(root), identity), holder)
        yield other.pid
    finally:
        other.kill()


def pool_of(sweeper: GridSweeper) -> DevicePoolLauncher:
    pool = DevicePoolLauncher()
    pool.setup(hydra_context=sweeper.hydra_context, task_function=None, config=sweeper.config)
    return pool


def test_a_job_whose_run_another_process_trains_is_recorded_as_running_elsewhere_not_completed(tmp_path):
    """The pool takes the run's lock before it starts a job: held by another process (two sweeps
    sharing a run, started 2 s apart), this sweep has no result of its own for that run, its record
    says so, and nothing is written into that run's live folder (it was a failed row, and its
    summary.json and output went into the other sweep's folder)."""
    sweeper = grid(tmp_path)
    (plan,) = sweeper.plan(["model=mlp", "seed=5"])
    pool = pool_of(sweeper)
    job = pool._prepare(0, QueuedJob(["model=mlp", "seed=5"]), DeviceSchedule(["0"]))  # before the other's
    with held_by_another_process(plan.folder.parent, plan.identity) as pid:
        returned = pool._claim(job)
    ((entry,), _) = sweep_record.read(tmp_path / "sweep") or ([], None)
    assert entry["outcome"] == "running elsewhere" and entry["summary"]["status"] == "running elsewhere"
    assert f"pid {pid}" in entry["summary"]["error"] and run_identity(returned.cfg) == plan.identity
    assert returned.return_value is None  # no metric: nothing for a sweeper to be told as a result
    assert not plan.folder.exists()


def started_job(sweeper: GridSweeper, overrides: list[str]) -> tuple[DevicePoolLauncher, Any]:
    """A job started by the real pool, whose process waits instead of training, until it is stopped."""
    pool, schedule = pool_of(sweeper), DeviceSchedule(["0"])
    job = pool._prepare(0, QueuedJob(overrides), schedule)
    job.command = [sys.executable, "-c", "import time; time.sleep(60)"]
    assert pool._claim(job) is None
    pool._start(job, schedule)
    return pool, job


def test_ctrl_c_as_a_job_starts_leaves_it_interrupted_not_failed(tmp_path):
    """It was labelled failed ("killed by SIGTERM"): the sweep's SIGTERM reached the job's process
    before its own handler was there."""
    pool, job = started_job(grid(tmp_path), ["model=mlp", "seed=5"])
    ((entry,), _) = sweep_record.read(tmp_path / "sweep")
    assert (entry["outcome"], entry["summary"]["status"]) == ("running", "running")
    pool._on_signal(signal.SIGINT, None)  # Ctrl-C: the sweep stops its jobs
    job.process.wait(timeout=30)
    pool._finish(job)
    ((entry,), _) = sweep_record.read(tmp_path / "sweep")
    assert entry["summary"]["status"] == "interrupted"
    assert entry["summary"]["error"] == "the sweep was stopped by SIGINT as the job ran"
    assert not Path(lock.lock_url(job.storage)).exists()  # the claim its process never took, given back


def test_a_run_of_another_process_training_meanwhile_makes_a_jobs_timing_shared(tmp_path):
    """Two sweeps at once: their runs overlapped in time, and no row said so (no †)."""
    pool, job = started_job(grid(tmp_path), ["model=mlp", "seed=5"])
    with held_by_another_process(job.storage.root, "default-theirs0000") as pid:
        pool._look_beside()
    pool.stop("SIGTERM")
    job.process.wait(timeout=30)
    pool._finish(job)
    ((entry,), _) = sweep_record.read(tmp_path / "sweep")
    assert entry["summary"]["sweep"]["beside"] == [f"default-theirs0000 (pid {pid})"]


def test_a_sweep_that_ends_in_an_error_reports_first_says_it_stopped_and_ends_with_its_error(
    tmp_path, capsys, caplog
):
    """A search stopped by an outage of its database printed its one line, then another report."""

    class Outage(LitlabError):
        exit_code = 1

    def launch(job_overrides, initial_job_idx: int) -> list:
        raise Outage("the study's database did not answer for 60 s")

    sweeper = grid(tmp_path)
    sweeper.hydra_context = HydraContext(sweeper.hydra_context.config_loader, Callbacks(sweeper.config))
    sweeper.launcher.launch = launch
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as ended:
        sweeper.sweep(["model=mlp", "precision=fp32,bf16"])
    assert ended.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "litlab: error: the study's database did not answer for 60 s"
    )
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("report of")]
    assert "2 runs (0 completed, 2 not started, 0 failed)" in line
    assert line.endswith("; the sweep stopped before its end: the study's database did not answer for 60 s")
    assert "**The sweep stopped before its end**" in (tmp_path / "sweep" / "report.md").read_text()


def test_an_edited_value_in_a_config_file_is_another_run_not_one_resumed_across_the_edit(tmp_path):
    """Job 0 of a sweep killed, ``dropout: 0.1`` edited to 0.9, the same command: fp32 used to
    resume (trained partly under each value) while bf16 trained fresh, and bf16 took the blame."""
    from litlab.config.preflight import CONFIG_DIR

    configs = tmp_path / "configs"
    (configs / "model").mkdir(parents=True)
    mine = configs / "model" / "mine.yaml"
    searchpath = f"hydra.searchpath=[file://{configs}]"

    def identities(dropout: float) -> list[str]:
        mine.write_text((CONFIG_DIR / "model" / "mlp.yaml").read_text().replace("0.1", str(dropout)))
        sweeper = grid(tmp_path, searchpath, arguments=("model=mine",))
        return [plan.identity for plan in sweeper.plan(["model=mine", "precision=fp32,bf16"])]

    assert "dropout: 0.1" in (CONFIG_DIR / "model" / "mlp.yaml").read_text()
    before, after = identities(0.1), identities(0.9)
    assert not set(before) & set(after)  # both jobs are new runs: none resumes the other value's run


def test_a_job_resumed_across_a_change_is_said_in_the_sweeps_log(tmp_path, caplog):
    from litlab.launch.multirun import job_config, record_job

    sweeper = grid(tmp_path)
    job = job_config(sweeper.hydra_context, sweeper.config, ["model=mlp"], 0)
    summary = {"status": "completed", "run_name": "mine", "resumed_across": ["code 8373778d→c6928336"]}
    with caplog.at_level("WARNING", logger="litlab.launch.multirun"):
        record_job(job.hydra, Path(job.hydra.runtime.output_dir), summary, sweep_record.TRAINED)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "job 0 resumed run mine across a change (code 8373778d→c6928336)" in line
    ((entry,), _) = sweep_record.read(tmp_path / "sweep")
    assert entry["summary"]["resumed_across"] == ["code 8373778d→c6928336"]


def test_a_key_typo_in_a_sweep_is_the_single_runs_one_line_before_any_job(tmp_path, capsys):
    """``-m precision=fp32,bf16 trainer.max_epoch=1``: every job composes, and each fails the check a
    single run's preflight makes. The sweeper checks each job once, as it plans it (it used to start
    the sweep and make every job a failed row)."""
    from litlab.cli.preflight import checked_config
    from litlab.config.rules import ConfigError

    with pytest.raises(ConfigError) as single:
        checked_config("train", ["model=mlp", "precision=fp32", "trainer.max_epoch=1"])
    sweeper = grid(tmp_path)
    line = refusal(sweeper, ["precision=fp32,bf16", "trainer.max_epoch=1"], capsys)
    assert line == "litlab: error: " + " ".join(str(single.value).split()) and "'trainer.max_epoch'" in line
    assert sweeper.launcher.jobs == [] and not (tmp_path / "sweep").exists()


def test_a_job_larger_than_the_pool_is_a_failed_row_on_gpus_and_runs_alone_on_slots(tmp_path):
    """On GPUs a job that needs more than the pool has never starts: one failed row, one line, no
    output.log. Without GPUs its "devices" are processes: the pool starts it (alone, on every slot)."""
    from litlab.launch.pool import DevicePoolLauncher, DeviceSchedule, QueuedJob, _Job

    sweeper = grid(tmp_path)
    pool = DevicePoolLauncher(devices=2)
    pool.setup(hydra_context=sweeper.hydra_context, task_function=None, config=sweeper.config)
    job = QueuedJob(["model=mlp", "trainer.accelerator=cpu", "trainer.devices=3", "strategy=ddp"])
    on_slots = pool._prepare(1, job, DeviceSchedule(["0", "1"], gpus=False))
    assert isinstance(on_slots, _Job) and on_slots.need == 3
    on_gpus = pool._prepare(0, job, DeviceSchedule(["0", "1"], gpus=True))
    ((entry,), _) = sweep_record.read(tmp_path / "sweep")
    too_large = entry["summary"]
    assert entry["outcome"] == sweep_record.NOT_STARTED and too_large["status"] == "failed"
    assert too_large["error"] == (
        "the job needs 3 devices (trainer.devices=3) and the pool has 2 (0,1): set hydra.launcher.devices"
    )
    assert too_large["sweep"]["devices"] == [] and on_gpus.return_value is None
    assert not (Path(too_large["run_dir"]) / "output.log").exists()


def test_a_global_batch_that_does_not_divide_for_one_job_stops_the_sweep_before_any_job(tmp_path, capsys):
    # Job 0 cannot split a global batch of 96 into accumulation 5; job 1 could (micro-batch 48). Found
    # by the sweep before any job's process would start: none did, and no sweep folder.
    sweeper = grid(tmp_path)
    line = refusal(sweeper, ["global_batch_size=96", "trainer.accumulate_grad_batches=5,2"], capsys)
    assert "global_batch_size=96" in line and "5" in line
    assert sweeper.launcher.jobs == [] and not (tmp_path / "sweep").exists()


def test_a_sweeper_that_stops_the_pool_says_why_and_the_pool_returns_to_it(tmp_path):
    """The search stops the pool when its database stays down: the pool stops its jobs, records the
    queued ones as stopped for that reason, and returns (it used to be sent SIGTERM, and said so)."""
    from litlab.launch.pool import DevicePoolLauncher, QueuedJob

    sweeper = grid(tmp_path)
    pool = DevicePoolLauncher()
    pool.setup(hydra_context=sweeper.hydra_context, task_function=None, config=sweeper.config)

    def next_job(index: int) -> QueuedJob | None:
        if index > 0:
            return None
        pool.stop("an outage of the study's database")  # as the search does from its callback
        return QueuedJob(["model=mlp", "seed=5"])

    pool.run_queue(next_job, lambda index, job_return: None)  # returns: no SystemExit
    ((entry,), _) = sweep_record.read(tmp_path / "sweep")
    assert entry["outcome"] == sweep_record.NOT_STARTED and entry["summary"]["status"] == "interrupted"
    assert entry["summary"]["error"] == (
        "the sweep was stopped by an outage of the study's database before the job started"
    )
    assert not (Path(entry["run_dir"]) / "output.log").exists()
