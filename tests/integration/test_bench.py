"""make bench (benchmarks/bench.py): the tiny mode runs every section for real; its parts check
what the full bench uses.

No test asserts a time: the bench measures, tests only prove that it measures what it says.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import bench, overhead
from omegaconf import OmegaConf

from litlab.config.preflight import check_train_config
from tests.conftest import REPO


@pytest.mark.slow
def test_tiny_bench_measures_every_section_and_writes_its_table(tmp_path: Path):
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "--tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    table = (out / "bench.md").read_text()
    assert table.strip() in result.stdout

    # Step overhead: the three runners took exactly the steps asked for, with the same threads.
    (case,) = report["step"].values()
    (run,) = case["runs"]
    assert {run[f"{r}_steps"] for r in bench.RUNNERS} == {case["steps"]}
    assert run["threads"] == report["machine"]["threads"]
    assert run["module"] == "ImageClassifier"  # litlab and bare Lightning trained the same class
    assert run["litlab_vs_lightning"] == pytest.approx(run["litlab_step_ms"] / run["lightning_step_ms"])
    assert run["ratio"] == pytest.approx(run["litlab_step_ms"] / run["plain_step_ms"])
    assert all(run[f"{r}_step_ms"] > 0 for r in bench.RUNNERS)
    assert "| cnn-digits | ImageClassifier | 30 |" in table
    # tiny: the digits' suggested augmentation (kornia, each sample its own draw) beside the default run
    (option,) = case["options"].values()
    assert option["step_ms"] > 0 and len(option["runs"]) == 1
    assert option["vs_default"]["median"] == pytest.approx(option["step_ms"] / run["litlab_step_ms"])
    assert option["cpu_vs_default"]["median"] > 0
    assert f"`{bench.AUGMENT_DIGITS}`" in table

    startup = report["startup"]
    for key in ("import_lightning_s", "first_step_s", "config_error_exit_s"):
        assert startup[key]["median"] > 0, key
    assert "precision=fp61" in table

    # The pool's sweep: every job timed by its own record, the efficiency from those times; the
    # grid's jobs all finished.
    pool, grid = report["sweep"]["pool"], report["sweep"]["grid"]
    assert [job["hold_s"] for job in pool["jobs"]] == [0.5, 0]
    lengths = [job["seconds"] for job in pool["jobs"]]
    assert pool["ideal_s"] == pytest.approx(max(max(lengths), sum(lengths) / 2))
    assert pool["makespan_s"] == pytest.approx(max(j["start_s"] + j["seconds"] for j in pool["jobs"]))
    assert pool["efficiency"] == pytest.approx(pool["makespan_s"] / pool["ideal_s"])
    assert all(0 < job["import_lightning_s"] < job["first_step_s"] < job["seconds"] for job in pool["jobs"])
    for job in pool["jobs"]:  # measured in each job's own process (benchmarks/import_probe)
        assert job["own_process_cost_s"] == pytest.approx(job["first_step_s"] - job["import_lightning_s"])
    assert {tuple(job["devices"]) for job in pool["jobs"]} == {("0",), ("1",)}  # both at once
    assert grid["runs"]["2"]["statuses"] == ["completed"]  # tiny: a grid of one job
    assert "makespan / ideal" in table and "| 2 | 1 |" in table

    # The loaders over one in-memory table: every loader timed alone and feeding training steps.
    loaders = report["loaders"]
    assert set(loaders["samples_per_s"]) == set(bench.LOADERS)
    for name, rates in loaders["samples_per_s"].items():
        for mode, rate in rates.items():
            plain = loaders["samples_per_s"]["DataLoader"][mode]
            assert rate > 0 and loaders["vs_dataloader"][name][mode] == pytest.approx(rate / plain)
    assert "**Loaders**" in table and "| ResumableDataLoader |" in table

    # DDP: both runners on 2 ranks, wall and main-thread CPU time side by side.
    (pair,) = report["ddp"]["runs"]
    assert pair["litlab_vs_lightning"] == pytest.approx(pair["litlab_step_ms"] / pair["lightning_step_ms"])
    assert pair["cpu_litlab_vs_lightning"] == pytest.approx(pair["litlab_cpu_ms"] / pair["lightning_cpu_ms"])
    assert "**DDP**" in table and "rank 0's main-thread CPU time" in table

    accelerator = report["accelerator"]
    if "skipped" in accelerator:  # no CUDA here: a reason, printed in the table
        assert "CUDA" in accelerator["skipped"] and accelerator["skipped"] in table
    else:
        assert all("error" not in r for r in accelerator["runs"]), accelerator

    # litlab's runs (the default and the option's) logged the step loss only where the logger
    # writes (every 10 steps), and the epoch means once an epoch (epoch 1 ends at step 19 of 30: the
    # digits' 1259 training samples hold 19 whole batches of 64).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted(out.glob("logs/*-cnn-digits*-litlab/train/runs/*/tensorboard"))
    assert len(runs) == 2, runs
    for events in runs:
        scalars = EventAccumulator(str(events))
        scalars.Reload()
        steps = {
            tag: [e.step for e in scalars.Scalars(tag) if e.step > 0] for tag in scalars.Tags()["scalars"]
        }
        assert steps["train/loss_step"] == [9, 19, 29]
        assert steps["train/loss"] == steps["train/acc"] == [18, 29]


@pytest.mark.parametrize(
    ("case", "module", "net"),
    [("mlp-digits", "ImageClassifier", "MLP"), ("char_lm", "CharLM", "CausalTransformer")],
)
def test_bare_lightning_and_plain_runners_train_each_task_from_its_config(case, module, net, tmp_path):
    # In-process (the tiny bench above runs them as processes for one case): the same runners serve
    # both example tasks, bare Lightning with the task's own LightningModule built from its config.
    steps, warmup = 6, 2
    bench.bare_lightning(bench.STEP_CASES[case], steps, warmup, tmp_path / "lightning.json")
    bench.plain_loop(bench.STEP_CASES[case], steps, warmup, tmp_path / "plain.json")
    lightning, plain = (json.loads((tmp_path / f"{r}.json").read_text()) for r in ("lightning", "plain"))
    assert (lightning["module"], plain["net"]) == (module, net)
    for result in (lightning, plain):
        assert len(result["step_ends"]) == steps and len(bench.steady_step_seconds(result)) == steps - warmup
        assert all(seconds > 0 for seconds in bench.steady_step_seconds(result))
    assert 0 < plain["mean_train_loss"] < 10


def test_overhead_counts_calls_exactly_per_part_and_times_pairs():
    # In-process, a short window: the counts are deterministic, so the parts can be checked exactly.
    result = overhead.count("mlp-digits", window=(3, 7))
    parts = result["parts"]
    assert {"RunStats", "NonFiniteLossGuard", "ReseedEveryStep", "EpochCheckpoint", "logger"} <= parts.keys()
    dispatch = result["one_callback_that_does_nothing"]
    assert dispatch > 50  # Lightning's per-step dispatch to one callback, before it does anything
    # Separate fits of callbacks with no per-step hook of their own: exactly the same count.
    assert parts["WorldCheck"] == parts["PreemptionCheckpoint"] == dispatch
    assert parts["NonFiniteLossGuard"] > dispatch  # its per-step gradient check
    assert result["separate"] > result["bare_lightning"] + 10 * dispatch  # each part a callback of its own
    # Combined, the parts cost at least 10 dispatches less; NoProfiler makes each dispatch cheaper.
    assert result["litlab"] < result["separate"] - 10 * dispatch
    assert 0 < result["one_callback_with_no_profiler"] < dispatch and result["no_profiler"] < 0
    timed = overhead.paired("mlp-digits", repeats=1, window=(3, 7))
    for clock in ("cpu", "wall"):
        assert all(ms > 0 for ms in timed[clock]["ms"].values()) and len(timed[clock]["runs"]["litlab"]) == 1
    table = overhead.markdown([result], [timed])
    assert "| + NonFiniteLossGuard |" in table and "| mlp-digits |" in table and "main-thread CPU" in table


@pytest.mark.parametrize("size", sorted(bench.ACCELERATOR_SHAPES))
@pytest.mark.parametrize(("precision", "accumulation"), [("fp16", 4), ("bf16", 1)])
def test_accelerator_runs_are_valid_train_configs(size: int, precision: str, accumulation: int, tmp_path):
    # Composed and checked as litlab-train would (the GPU section cannot run on this machine).
    overrides = [
        *bench.accelerator_overrides("cuda", size, 256, precision, accumulation),
        *bench.litlab_timing_overrides(tmp_path / "steps.json", 25, 5),
    ]
    cfg = bench.compose_train_config(overrides)
    check_train_config(cfg, [])
    assert cfg.data.image_shape == bench.ACCELERATOR_SHAPES[size]
    assert cfg.model.net.small_inputs == (size == 32)
    assert (cfg.trainer.accelerator, cfg.trainer.accumulate_grad_batches) == ("gpu", accumulation)
    assert cfg.callbacks.bench_timer.path == str(tmp_path / "steps.json")
    # 4 training batches per epoch: a whole number of accumulation windows.
    n = cfg.data.num_samples
    assert n - int(n * cfg.data.val_fraction) - int(n * cfg.data.test_fraction) == 4 * cfg.data.batch_size


@pytest.mark.parametrize(
    ("case", "option"),
    [(case, option) for case, options in bench.Settings().options.items() for option in options],
)
def test_options_are_valid_train_configs(case: str, option: str, tmp_path: Path):
    overrides = [*bench.STEP_CASES[case], option]
    cfg = bench.compose_train_config(
        [*overrides, *bench.litlab_timing_overrides(tmp_path / "s.json", 80, 10)]
    )
    check_train_config(cfg, [])
    # An option the bench measures changes what the default run does.
    default = bench.compose_train_config(
        [
            *bench.STEP_CASES[case],
            *bench.litlab_timing_overrides(tmp_path / "s.json", 80, 10),
        ]
    )
    key = option.split("=")[0]
    assert OmegaConf.select(cfg, key) != OmegaConf.select(default, key)


def test_speedups_and_memory_are_relative_to_fp32_of_the_same_input_and_accumulation():
    def run(size, precision, accumulation, samples_per_s, memory):
        return {
            "size": size,
            "batch_size": 512,
            "precision": precision,
            "accumulation": accumulation,
            "samples_per_s": samples_per_s,
            "peak_memory_mib": memory,
            "flops_per_sample": 2e9,
        }

    runs = [
        run(32, "fp32", 1, 1000.0, 8000.0),
        run(32, "bf16", 1, 2500.0, 5000.0),
        run(32, "fp32", 4, 1100.0, 8000.0),
        run(32, "bf16", 4, 3300.0, 4000.0),
        {"size": 224, "batch_size": 64, "precision": "fp16", "accumulation": 1, "error": "exit status 1"},
    ]
    bench.compare_to_fp32(runs)
    assert runs[1]["speedup_vs_fp32"] == pytest.approx(2.5)
    assert runs[1]["memory_vs_fp32"] == pytest.approx(5000 / 8000)
    assert runs[3]["speedup_vs_fp32"] == pytest.approx(3.0)
    assert runs[3]["tflops"] == pytest.approx(3300 * 2e9 / 1e12)
    assert "speedup_vs_fp32" not in runs[4]
    assert "skipped" in bench.markdown({**_report(), "accelerator": {"skipped": "no CUDA device visible"}})
    table = bench.markdown({**_report(), "accelerator": {"device": "cuda", "runs": runs}})
    assert "| 3x32x32 |" in table and "2.50" in table and "failed: exit status 1" in table


def _report() -> dict:
    return {"date": "2026-12-01", "tiny": False, "machine": bench.machine(threads=2)}


def test_probe_counts_resnet_flops_per_sample(tmp_path: Path):
    out = tmp_path / "probe.json"
    bench.probe(out, "cpu", 224, max_batch=4)  # below the first trial batch: FLOPs only
    result = json.loads(out.read_text())
    # resnet18 at 224x224: ~1.8 GMAC forward, so forward + backward ~ 3 x 3.6 GFLOP.
    assert 9e9 < result["flops_per_sample"] < 12e9
    assert result["max_batch"] == 8


def test_probe_doubles_the_batch_while_a_training_step_fits_up_to_its_cap(tmp_path: Path):
    # On a CPU every batch fits: the probe doubles from 8 and stops at its cap (on CUDA also at
    # out-of-memory, or where the peak leaves no room for the data).
    out = tmp_path / "probe.json"
    bench.probe(out, "cpu", 32, max_batch=20)
    result = json.loads(out.read_text())
    assert (result["tried"], result["max_batch"], result["tried_up_to"]) == ([8, 16], 16, 20)


def test_bad_sections_and_cases_are_refused_with_the_allowed_ones(capsys):
    for args, word in ((["--sections", "step,gpu"], "gpu"), (["--cases", "vit-digits"], "vit-digits")):
        with pytest.raises(SystemExit) as exit_info:
            bench.parse_args(args)
        assert exit_info.value.code == 2
        message = capsys.readouterr().err.strip().splitlines()[-1]
        assert word in message and "choose from" in message
