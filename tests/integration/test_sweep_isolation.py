"""Every sweep job runs exactly as it would alone: a process of its own, on its share of the pool.

A real multirun (``litlab-train -m``) whose jobs mix precisions and device counts, two of them at
once on a pool of two CPU slots. Each job is compared with the same settings run alone, as a fresh
``litlab-train`` process: the same world size, the same checkpoints written, bitwise-equal final
weights, equal metrics and the same torch flags while training.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from litlab.run import sweep_record
from tests.conftest import FAULTS_IMPORTABLE, TINY, litlab, ranks_that_joined, start_litlab
from tests.integration.test_sweeps import rank_lines, report_rows

pytestmark = pytest.mark.slow

# Tiny, but two epochs: the weights after the second depend on everything the first one did.
BASE = ["model=mlp", "trainer.max_epochs=2", *(t for t in TINY if not t.startswith("trainer.max_epochs="))]
ENV = {**FAULTS_IMPORTABLE, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# Settings and what they mean for a run: the fields of summary.json that must match.
SAME = ("status", "world_size", "devices", "num_nodes", "global_step", "epochs", "micro_batch_size")
SAME += ("accumulate_grad_batches", "effective_batch_size", "torch_flags")


@dataclass
class Outcome:
    run_dir: Path
    summary: dict
    checkpoints: list[str]  # the names of the checkpoint files the run wrote
    weights: dict[str, torch.Tensor]  # of last.ckpt: the state training ended in


def outcome_of(run_dir: Path) -> Outcome:
    summary = json.loads((run_dir / "summary.json").read_text())
    folder = Path(summary["checkpoints"]["dir"])
    checkpoints = sorted(p.name for p in folder.glob("*.ckpt"))
    last = torch.load(folder / "last.ckpt", map_location="cpu", weights_only=True)
    return Outcome(run_dir, summary, checkpoints, last["state_dict"])


def run_alone(settings: list[list[str]], root: Path) -> list[Outcome]:
    """Each settings list as its own fresh ``litlab-train`` process (two at a time, on 2 cores)."""
    outcomes: list[Outcome | None] = [None] * len(settings)
    pending = list(enumerate(settings))
    while pending:
        batch, pending = pending[:2], pending[2:]
        started = []
        for index, overrides in batch:
            log_dir = root / f"alone-{index}"
            process = start_litlab("litlab-train", *overrides, env={**ENV, "LITLAB_LOG_DIR": str(log_dir)})
            started.append((index, log_dir, process))
        for index, log_dir, process in started:
            output, _ = process.communicate(timeout=300)
            runs = log_dir / "train" / "runs"
            assert runs.is_dir(), f"{overrides} made no run directory:\n{output[-3000:]}"
            (run_dir,) = runs.iterdir()
            outcomes[index] = outcome_of(run_dir)
            outcomes[index].summary["output_tail"] = output[-2000:]
    return outcomes


def run_sweep(root: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, list[Outcome]]:
    log_dir = root / "sweep"
    result = litlab("litlab-train", *overrides, env={**ENV, "LITLAB_LOG_DIR": str(log_dir)}, timeout=600)
    (sweep_dir,) = (log_dir / "train" / "multiruns").iterdir()
    jobs = sorted((d for d in sweep_dir.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
    return result, [outcome_of(job) for job in jobs]


def error_of(outcome: Outcome) -> str | None:
    """The run's error, with its own checkpoint folder (which the message may name) left out."""
    error = outcome.summary["error"]
    return error and error.replace(outcome.summary["checkpoints"]["dir"], "<checkpoints>")


def assert_same_run(job: Outcome, alone: Outcome, label: str) -> None:
    """The job did what the same settings do alone: same world, checkpoints, weights, metrics."""
    context = f"{label}: job {job.run_dir} vs alone {alone.run_dir}\n{alone.summary.get('output_tail', '')}"
    for key in SAME:
        assert job.summary.get(key) == alone.summary.get(key), f"{key} differs; {context}"
    assert job.summary["metrics"] == alone.summary["metrics"], context
    assert error_of(job) == error_of(alone), context
    assert job.checkpoints == alone.checkpoints, context
    assert job.weights.keys() == alone.weights.keys(), context
    for name, tensor in job.weights.items():
        assert torch.equal(tensor, alone.weights[name]), f"weights {name} differ; {context}"


def test_readme_device_count_sweep_runs_every_job_with_its_own_world(tmp_path):
    """The README's precision x device-count sweep (tiny) on a pool of 2 CPU slots: the 2-device
    jobs first, one at a time, then the two 1-device jobs together; every job a process of its own
    (strategy=ddp), started once, its ranks in one process group, as it would run alone."""
    result, jobs = run_sweep(
        tmp_path,
        "sweep=precision_accumulation",
        "precision=fp32,bf16",
        "trainer.accumulate_grad_batches=1",
        "trainer.devices=1,2",
        "strategy=ddp",
        "hydra.launcher.devices=2",
        *BASE,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    grid = [(precision, devices) for precision in ("fp32", "bf16") for devices in (1, 2)]
    assert [(j.summary["groups"]["precision"], j.summary["devices"]) for j in jobs] == grid
    # One sweep, whatever ran its ranks: no rank started a sweep or a single run of its own.
    sweep_dir = jobs[0].run_dir.parent
    assert result.stdout.count("Launching 4 jobs") == 1, result.stdout[-3000:]
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == [".jobs", "0", "1", "2", "3"]
    # Each job's folder is its run's (the sweep's folder links to it), each started once, no other run.
    runs = sorted((tmp_path / "sweep" / "train" / "runs").iterdir())
    assert sorted(job.run_dir.resolve() for job in jobs) == runs
    assert [len(json.loads((run / "run.json").read_text())["starts"]) for run in runs] == [1] * 4
    assert [row["status"] for row in report_rows(sweep_dir)] == ["completed"] * 4
    # Run alone: a 1-device job that ran beside another, and a 2-device DDP job (both precisions).
    compared = [("fp32", 1), ("bf16", 2)]
    alone = dict(
        zip(
            compared,
            run_alone(
                [[f"precision={p}", f"trainer.devices={d}", "strategy=ddp", *BASE] for p, d in compared],
                tmp_path,
            ),
            strict=True,
        )
    )
    recorded = {entry["job_num"]: entry["summary"]["sweep"] for entry in sweep_record.read(sweep_dir)[0]}
    for job, (precision, devices) in zip(jobs, grid, strict=True):
        label = f"precision={precision} trainer.devices={devices}"
        assert job.summary["status"] == "completed", label
        # Every rank of this job joined one process group of the job's size, and no other one.
        assert ranks_that_joined(job.run_dir) == [f"{r} {r + 1}/{devices}" for r in range(devices)], label
        assert len(job.summary["memory"]["peak_rss_mib_per_rank"]) == devices, label
        # Exactly one process per rank trained in the job's directory, all of them this job.
        started = rank_lines(job.run_dir)
        assert sorted(rank for rank, _ in started) == list(range(devices)), started
        assert {identity for _, identity in started} == {job.summary["run_name"]}, started
        # The pool's record of the job (devices, beside) is in the sweep's record, not in summary.json.
        sweep = recorded[int(job.run_dir.name)]
        assert (sweep["dir"], sweep["job_num"]) == (str(sweep_dir), int(job.run_dir.name)), label
        assert len(sweep["devices"]) == devices, label
        # Largest first: the 2-device jobs alone, then both 1-device jobs at once.
        assert sweep["beside"] == ([] if devices == 2 else [j for j in (0, 2) if j != sweep["job_num"]]), (
            label
        )
        assert "last.ckpt" in job.checkpoints, label
        if (precision, devices) in alone:
            assert_same_run(job, alone[precision, devices], label)


def test_a_run_whose_process_group_is_smaller_than_its_world_fails_in_one_line(tmp_path):
    # LOCAL_RANK set: Lightning takes the ranks as started by someone else, launches none, and finds
    # the datamodule's one-member group already there, as in a process an earlier job had used.
    env = {**ENV, "LITLAB_LOG_DIR": str(tmp_path / "logs"), "LOCAL_RANK": "0"}
    overrides = [
        "strategy=ddp",
        "trainer.devices=2",
        "data._target_=tests.faults.DigitsInALeftoverProcessGroup",
    ]
    result = litlab("litlab-train", *overrides, *BASE, env=env)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(
        "litlab: error: rank 0: the run did not happen as configured: trainer.world_size is 2 "
        "(devices x nodes) but its process group had 1 member; every rank stopped"
    ), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    outcome = json.loads((run_dir / "summary.json").read_text())
    assert outcome["status"] == "failed" and outcome["error"] in last_line
    # Found before the first step, not after training a run with half its ranks.
    assert outcome["world"] == {
        "configured_world_size": 2,
        "process_group_size": 1,
        "optimizer_steps_per_rank": [0],
    }
    assert outcome["global_step"] == 0
