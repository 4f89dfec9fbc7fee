"""``make bench`` (``python -m benchmarks.bench``): what litlab costs, against Lightning and PyTorch.

Every measurement is a fresh process started from here, one after the other and alternating
(litlab, bare Lightning, plain, litlab, ...), so machine noise falls on all sides alike. Results go
to ``logs/bench/<timestamp>/`` as ``bench.json`` and ``bench.md`` (the tables, also printed), with
every process's output under ``processes/`` and its run folder under ``logs/``.

Sections:
1. step: median time per optimizer step (warm-up excluded) of three runners on the same config
   (net, data, optimizer, batch, seed, trainer settings, thread count), for each example task:
   ``litlab-train``; ``bare_lightning``, the same LightningModule and datamodule classes built from
   the config by litlab's own ``build_module``/``build_datamodule`` and fitted by a plain
   ``lightning.Trainer`` with no logger, litlab callbacks or checkpointing (litlab / bare Lightning is
   litlab's own cost, whatever the task); and ``plain_loop``, a hand-written PyTorch loop (the one
   task-specific part, ``PLAIN_TASKS``). Ratios are per repeat, reported as median and min-max.
   ``--threads`` sets every run's torch threads (default: one per core). Options run beside the
   default litlab run of their case, as a ratio to it: speed options (compile, channels_last, cudnn
   benchmark) on the 3x32x32 cnn, and on the digits cnn the augmentation configs/data/digits.yaml
   suggests (kornia, each sample its own draw) against none.
2. startup: process start to the first optimizer step, beside ``import torch``/``import lightning``,
   and how long a config error (``precision=fp61``) takes to exit.
3. sweep: the default launcher's pool (``hydra.launcher.devices=2`` on this CPU): its efficiency on
   jobs of known, unequal lengths (makespan / max(longest job, total job time / devices)), the cost
   of a job's own process (first optimizer step minus ``import lightning``), and the wall time of
   the 9-job ``sweep=precision_accumulation`` with one and two devices.
4. loaders: samples/s of a plain DataLoader, litlab's ResumableDataLoader and TensorBatches over the
   same small in-memory table (one process, no workers), alone and feeding a small MLP's training
   steps (issue 40: ResumableDataLoader once made such a task ~7x slower).
5. ddp: the cnn-digits case on 2 CPU ranks (gloo, Lightning's subprocess launcher), litlab and bare
   Lightning alternating: median optimizer step (issue 41: litlab / bare Lightning at most 1.05) and
   process start to first optimizer step (a 2-rank start: every rank's own start and the launcher).
6. accelerator (CUDA only): resnet18 throughput, peak memory and TFLOP/s per precision and
   accumulation, and the matmul/TF32 settings they ran with.

This module imports neither torch nor Lightning at the top: the parent process only starts others.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("benchmarks.bench")
REPO = Path(__file__).resolve().parents[1]

STEP_TIMER = "benchmarks.step_timer.StepTimer"
HOLD_AFTER_TRAINING = "benchmarks.step_timer.HoldAfterTraining"

# The step-overhead cases: name -> litlab-train overrides. cnn-digits is the default run; char_lm
# the second example task.
STEP_CASES: dict[str, list[str]] = {
    "mlp-digits": ["model=mlp", "data=digits"],
    "cnn-digits": ["model=cnn", "data=digits"],
    "cnn-synthetic-3x32x32": ["model=cnn", "data=synthetic"],
    "char_lm": ["experiment=char_lm"],
}


# The augmentation configs/data/digits.yaml suggests: what drawing for each sample of a batch costs.
AUGMENT_DIGITS = (
    "data.augment=[{_target_: kornia.augmentation.RandomAffine, degrees: 10, translate: [0.1, 0.1], p: 1.0}]"
)

TINY_RUN = ("trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=2")
TINY_RUN += ("test_after_fit=false",)
# issue 20: the pool's makespan at most 15 % above the ideal; a job's own process at most 1.5 s more
# than `import lightning` before its first optimizer step.
POOL_EFFICIENCY_TARGET = 1.15
OWN_PROCESS_COST_TARGET_S = 1.5


@dataclass
class Settings:
    """How much to run: the full bench, or the tiny mode a test uses to keep the bench working."""

    repeats: int = 5  # this VM's speed jumps between runs (up to 2x): medians need several
    steps: dict[str, int] = field(
        default_factory=lambda: {
            "mlp-digits": 400,
            "cnn-digits": 300,
            "cnn-synthetic-3x32x32": 80,
            "char_lm": 300,
        }
    )
    warmup_steps: int = 10
    cases: tuple[str, ...] = tuple(STEP_CASES)
    # Pool efficiency: seconds each job waits after training (its known, unequal length), the
    # jobs' settings. A long job first and short ones: the short ones share the other device.
    pool_holds: tuple[float, ...] = (12, 2, 3, 4, 6, 2.5)
    pool_overrides: tuple[str, ...] = ("model=mlp", "trainer.max_epochs=1", "test_after_fit=false")
    # The 9-job sweep, timed on a pool of 1 and of 2 devices.
    grid_overrides: tuple[str, ...] = ("sweep=precision_accumulation", "trainer.max_epochs=1")
    grid_devices: tuple[int, ...] = (1, 2)
    # Options, off by default: each runs as one more litlab run beside the default of its case.
    options: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {
            "cnn-synthetic-3x32x32": ("compile=true", "model.channels_last=true", "trainer.benchmark=true"),
            "cnn-digits": (AUGMENT_DIGITS,),
        }
    )
    import_modules: tuple[str, ...] = ("torch", "lightning")
    ddp_steps: int = 150
    loader_epochs: int = 5  # alternating epochs of each loader: the median counts
    accelerator_steps: int = 25
    accelerator_warmup: int = 5
    # The probe doubles the batch until fp32 training runs out of memory, up to these caps.
    accelerator_max_batch: dict[int, int] = field(default_factory=lambda: {32: 8192, 224: 1024})
    accelerator_precisions: tuple[str, ...] = ("fp32", "fp16", "bf16")
    accelerator_accumulations: tuple[int, ...] = (1, 4)

    @classmethod
    def tiny(cls) -> Settings:
        return cls(
            repeats=1,
            steps=dict.fromkeys(STEP_CASES, 30),
            warmup_steps=5,
            cases=("cnn-digits",),
            # Two jobs, both at once: what the sweep section computes needs no more processes.
            pool_holds=(0.5, 0),
            pool_overrides=("model=mlp", *TINY_RUN),
            grid_overrides=(
                "sweep=precision_accumulation",
                "precision=fp32",
                "trainer.accumulate_grad_batches=1",
                *TINY_RUN,
            ),
            grid_devices=(2,),
            options={"cnn-digits": (AUGMENT_DIGITS,)},
            import_modules=("lightning",),
            ddp_steps=12,
            loader_epochs=1,
            accelerator_steps=4,
            accelerator_warmup=2,
            accelerator_max_batch={32: 8},
            accelerator_precisions=("fp32", "bf16"),
            accelerator_accumulations=(1,),
        )


# --- the bare Lightning and plain PyTorch runners (each in its own process: ------------------
# `python -m benchmarks.bench lightning|plain OUT STEPS WARMUP OVERRIDES...`)


def seeded_config(overrides: list[str]) -> Any:
    """The run's config, composed as litlab-train composes it, with the run's seed set."""
    cfg = compose_train_config(overrides)
    import lightning as L

    L.seed_everything(cfg.seed, verbose=False)
    return cfg


def bare_lightning(overrides: list[str], steps: int, warmup_steps: int, out: Path) -> None:
    """The run's own LightningModule and datamodule, built from the same config as litlab-train
    builds them, fitted by a plain ``lightning.Trainer`` with the config's trainer settings but no
    logger, no litlab callbacks and no checkpointing, only the step timer: litlab / this is what
    litlab itself costs, for any task."""
    cfg = seeded_config(overrides)
    import lightning as L
    from omegaconf import OmegaConf

    from benchmarks.step_timer import StepTimer
    from litlab.config.rules import batch_sizes
    from litlab.run.build import build_datamodule, build_module, build_strategy

    data = build_datamodule(cfg, batch_sizes(cfg.data, cfg.trainer).micro)
    module = build_module(cfg)
    trainer_args = {
        **OmegaConf.to_container(cfg.trainer, resolve=True),
        "max_steps": steps,
        "max_epochs": -1,
        "enable_model_summary": False,
    }
    trainer = L.Trainer(
        **trainer_args,
        strategy=build_strategy(cfg.strategy),  # the config's own (ddp: its timeout, its launcher)
        precision=cfg.precision.value,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[StepTimer(str(out), warmup_steps=warmup_steps, runner="lightning")],
    )
    trainer.fit(module, datamodule=data)
    import torch

    if torch.distributed.is_initialized():  # gloo's threads would otherwise abort the exit (status -6)
        torch.distributed.destroy_process_group()


def vision_task(cfg: Any, data: Any) -> tuple[Any, tuple[Any, ...], Callable[..., Any]]:
    """(net, training tensors, loss of a batch) of the image classifier, without Lightning."""
    import torch
    from hydra.utils import instantiate

    net = instantiate(cfg.model.net, image_shape=data.image_shape, num_classes=data.num_classes)

    def loss(images: Any, labels: Any) -> Any:
        return torch.nn.functional.cross_entropy(net(images), labels)

    return net, data.splits["train"], loss


def char_lm_task(cfg: Any, data: Any) -> tuple[Any, tuple[Any, ...], Callable[..., Any]]:
    """(net, training tensors, loss of a batch) of the character language model, without Lightning."""
    import torch
    from hydra.utils import instantiate

    net = instantiate(cfg.model.net, vocab_size=data.vocab_size, block_size=data.block_size)

    def loss(sequences: Any) -> Any:
        logits = net(sequences[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), sequences[:, 1:].flatten())

    return net, (data.splits["train"],), loss


# The plain PyTorch loop is task-specific (the engine knows no task; the bench may): per model._target_.
PLAIN_TASKS = {
    "project.vision.module.ImageClassifier": vision_task,
    "project.char_lm.module.CharLM": char_lm_task,
}


def plain_loop(overrides: list[str], steps: int, warmup_steps: int, out: Path) -> None:
    """A hand-written training loop, no Lightning: the same net, optimizer, data and batch as litlab."""
    cfg = seeded_config(overrides)
    import torch
    from hydra.utils import instantiate

    from litlab.config.rules import batch_sizes
    from litlab.run.build import build_datamodule

    task = PLAIN_TASKS.get(cfg.model._target_)
    if task is None:
        raise SystemExit(
            f"bench: no plain PyTorch loop for model._target_={cfg.model._target_}: add one to "
            f"benchmarks/bench.py PLAIN_TASKS (it has {', '.join(PLAIN_TASKS)})"
        )
    batch_size = batch_sizes(cfg.data, cfg.trainer).micro
    data = build_datamodule(cfg, batch_size)
    data.setup("fit")  # no Trainer: the training split of an in-memory datamodule, on the CPU
    net, tensors, loss_of = task(cfg, data)
    optimizer = instantiate(cfg.optimizer, _convert_="all")(net.parameters())
    n = len(tensors[0])
    net.train()
    step_ends: list[float] = []
    step_cpu_ends: list[float] = []
    first_step_unix = None
    loss_sum = torch.zeros(())  # accumulated on the device; read once at the end (no per-step sync)
    while len(step_ends) < steps:
        order = torch.randperm(n)
        for start in range(0, n, batch_size):
            index = order[start : start + batch_size]
            loss = loss_of(*(t[index] for t in tensors))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            step_ends.append(time.perf_counter())
            step_cpu_ends.append(time.thread_time())
            first_step_unix = first_step_unix or time.time()
            if len(step_ends) == steps:
                break
    result = {
        "runner": "plain",
        "net": type(net).__name__,
        "first_step_unix": first_step_unix,
        "step_ends": step_ends,
        "step_cpu_ends": step_cpu_ends,
        "warmup_steps": warmup_steps,
        "threads": torch.get_num_threads(),
        "device": "cpu",
        "mean_train_loss": float(loss_sum) / steps,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")


def compose_train_config(overrides: list[str]) -> Any:
    """configs/train.yaml with the overrides, composed as litlab-train composes it (no torch)."""
    from hydra import compose, initialize_config_dir

    from litlab.config import preflight, schema

    schema.register()
    with initialize_config_dir(config_dir=str(preflight.CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


# --- running processes -------------------------------------------------------------------------


@dataclass
class Bench:
    """Starts the measured processes; every one writes its output to a log file in the bench folder."""

    dir: Path
    settings: Settings
    threads: int
    env: dict[str, str] = field(init=False)
    _count: int = 0

    def __post_init__(self) -> None:
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "LITLAB_LOG_DIR": str(self.dir / "logs"),  # litlab's run folders stay inside the bench's
            "OMP_NUM_THREADS": str(self.threads),
            # litlab-train imports the bench's step timer (benchmarks.step_timer) from the repository.
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        }
        self.env.pop("HYDRA_FULL_ERROR", None)

    def process(
        self, name: str, args: Sequence[str], check: bool = True, env: dict[str, str] | None = None
    ) -> tuple[float, float, int]:
        """Runs a Python process; returns (unix start time, wall seconds, exit status)."""
        self._count += 1
        output = self.output_log(name)
        output.parent.mkdir(parents=True, exist_ok=True)
        with output.open("w") as sink:
            started_unix, started = time.time(), time.perf_counter()
            # Each process gets its own log folder: repeats of one command would otherwise find their
            # run identity completed (resume=auto) and time a run that trains nothing.
            own_logs = self.dir / "logs" / f"{self._count:03d}-{file_name(name)}"
            env = {**self.env, "LITLAB_LOG_DIR": str(own_logs), **(env or {})}
            status = subprocess.run(
                [sys.executable, *args], stdout=sink, stderr=subprocess.STDOUT, env=env
            ).returncode
            seconds = time.perf_counter() - started
        if check and status != 0:
            tail = output.read_text()[-2000:]
            raise RuntimeError(f"{name} exited with status {status} (log: {output}):\n{tail}")
        log.info("%-40s %6.2f s", name, seconds)
        return started_unix, seconds, status

    def output_log(self, name: str) -> Path:
        return self.dir / "processes" / f"{self._count:03d}-{file_name(name)}.log"

    def import_seconds(self, module: str) -> tuple[float, float]:
        """(process start to ``import module`` done, the whole process with its exit) in seconds."""
        code = f"import time, {module}; print(time.time())"
        started_unix, seconds, _ = self.process(f"import-{module}", ["-c", code])
        imported_unix = float(self.output_log(f"import-{module}").read_text().split()[-1])
        return imported_unix - started_unix, seconds

    def timed_run(self, name: str, runner: str, overrides: list[str], steps: int) -> dict[str, Any]:
        """One litlab-train or plain-loop run of ``steps`` optimizer steps; its step timings."""
        result_file = self.dir / "steps" / f"{self._count + 1:03d}-{file_name(name)}-{runner}.json"
        result_file.parent.mkdir(parents=True, exist_ok=True)
        warmup = self.settings.warmup_steps
        if runner == "litlab":
            args = [
                "-m",
                "litlab.cli.train",
                *overrides,
                *litlab_timing_overrides(result_file, steps, warmup),
            ]
        else:  # plain or lightning
            args = ["-m", "benchmarks.bench", runner, str(result_file), str(steps), str(warmup), *overrides]
        started_unix, seconds, _ = self.process(f"{name}-{runner}", args)
        result = json.loads(result_file.read_text())
        result["process_start_unix"], result["process_seconds"] = started_unix, seconds
        return result


def file_name(name: str) -> str:
    """``name`` with what an override's value cannot hold (``=``, spaces...) replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def litlab_timing_overrides(result_file: Path, steps: int, warmup_steps: int) -> list[str]:
    return [
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=-1",
        "test_after_fit=false",
        f"+callbacks.bench_timer._target_={STEP_TIMER}",
        f"+callbacks.bench_timer.path={result_file}",
        f"+callbacks.bench_timer.warmup_steps={warmup_steps}",
    ]


def steady_step_seconds(result: dict[str, Any], clock: str = "step_ends") -> list[float]:
    """Seconds of each optimizer step after warm-up (the gaps between consecutive step ends);
    ``clock="step_cpu_ends"`` gives the main thread's CPU seconds instead."""
    ends = result[clock][result["warmup_steps"] - 1 :]
    return [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]


def median_ms(result: dict[str, Any], clock: str = "step_ends") -> float:
    return 1000 * statistics.median(steady_step_seconds(result, clock))


def spread(values: Sequence[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": list(values),
    }


RUNNERS = ("litlab", "lightning", "plain")
# issue 12: litlab may add at most 5% to the per-step time of the same training in bare Lightning.
LITLAB_VS_LIGHTNING_TARGET = 1.05


# --- sections ------------------------------------------------------------------------------


def step_and_startup_sections(bench: Bench) -> tuple[dict[str, Any], dict[str, Any]]:
    """Step overhead per case: litlab, bare Lightning and plain runs alternating; startup figures
    measured alongside the default case (cnn-digits), so they share its noise."""
    settings = bench.settings
    cases: dict[str, Any] = {}
    startup: dict[str, list[float]] = {
        "import_torch_s": [],
        "import_torch_process_s": [],
        "import_lightning_s": [],
        "import_lightning_process_s": [],
        "first_step_s": [],
        "config_error_exit_s": [],
    }
    for repeat in range(settings.repeats):
        for name in settings.cases:
            steps = settings.steps[name]
            case = cases.setdefault(name, {"overrides": STEP_CASES[name], "steps": steps, "runs": []})
            results = {runner: bench.timed_run(name, runner, STEP_CASES[name], steps) for runner in RUNNERS}
            threads = {result["threads"] for result in results.values()}
            if len(threads) != 1:
                raise RuntimeError(f"{name}: the runs used different thread counts {sorted(threads)}")
            pair: dict[str, Any] = {"threads": threads.pop()}
            for runner, result in results.items():
                pair[f"{runner}_step_ms"] = median_ms(result)
                pair[f"{runner}_cpu_ms"] = median_ms(result, "step_cpu_ends")
                pair[f"{runner}_steps"] = len(result["step_ends"])
            modules = {results[r]["module"] for r in ("litlab", "lightning")}
            if len(modules) != 1:
                raise RuntimeError(f"{name}: litlab and bare Lightning trained different modules {modules}")
            pair["module"] = modules.pop()
            pair["ratio"] = pair["litlab_step_ms"] / pair["plain_step_ms"]
            pair["lightning_ratio"] = pair["lightning_step_ms"] / pair["plain_step_ms"]
            pair["litlab_vs_lightning"] = pair["litlab_step_ms"] / pair["lightning_step_ms"]
            # The main thread's CPU time: what other processes on the machine do not change.
            pair["cpu_litlab_vs_lightning"] = pair["litlab_cpu_ms"] / pair["lightning_cpu_ms"]
            case["runs"].append(pair)
            for option in settings.options.get(name, ()):
                variant = bench.timed_run(f"{name}+{option}", "litlab", [*STEP_CASES[name], option], steps)
                case.setdefault("options", {}).setdefault(option, []).append(
                    {
                        "step_ms": median_ms(variant),
                        "vs_default": median_ms(variant) / pair["litlab_step_ms"],
                        # Main-thread CPU time: steadier on a machine other processes share.
                        "cpu_vs_default": median_ms(variant, "step_cpu_ends") / pair["litlab_cpu_ms"],
                        "first_step_s": variant["first_step_unix"] - variant["process_start_unix"],
                        "default_first_step_s": results["litlab"]["first_step_unix"]
                        - results["litlab"]["process_start_unix"],
                    }
                )
            if name == "cnn-digits":  # the default `litlab-train`: startup figures beside it
                litlab = results["litlab"]
                startup["first_step_s"].append(litlab["first_step_unix"] - litlab["process_start_unix"])
                for module in settings.import_modules:
                    imported, whole = bench.import_seconds(module)
                    startup[f"import_{module}_s"].append(imported)
                    startup[f"import_{module}_process_s"].append(whole)
                _, seconds, status = bench.process(
                    "config-error", ["-m", "litlab.cli.train", "precision=fp61"], check=False
                )
                if status != 2:
                    raise RuntimeError(f"precision=fp61 exited with status {status}, expected 2")
                startup["config_error_exit_s"].append(seconds)
        log.info("repeat %d of %d done", repeat + 1, settings.repeats)
    for case in cases.values():
        runs = case["runs"]
        for runner in RUNNERS:
            case[f"{runner}_step_ms"] = statistics.median(r[f"{runner}_step_ms"] for r in runs)
        for ratio in ("ratio", "lightning_ratio", "litlab_vs_lightning", "cpu_litlab_vs_lightning"):
            case[ratio] = spread([r[ratio] for r in runs])
        for option, variants in case.get("options", {}).items():
            case["options"][option] = {
                "step_ms": statistics.median(v["step_ms"] for v in variants),
                "vs_default": spread([v["vs_default"] for v in variants]),
                "cpu_vs_default": spread([v["cpu_vs_default"] for v in variants]),
                "first_step_s": statistics.median(v["first_step_s"] for v in variants),
                "extra_first_step_s": statistics.median(
                    v["first_step_s"] - v["default_first_step_s"] for v in variants
                ),
                "runs": variants,
            }
    if startup["first_step_s"]:  # what litlab adds to Lightning's import, per repeat
        pairs = zip(startup["first_step_s"], startup["import_lightning_s"], strict=True)
        startup["first_step_after_lightning_import_s"] = [first - imported for first, imported in pairs]
    return cases, {k: spread(v) for k, v in startup.items() if v}


DDP_CASE = [*STEP_CASES["cnn-digits"], "strategy=ddp", "trainer.devices=2"]


def ddp_section(bench: Bench) -> dict[str, Any]:
    """litlab and bare Lightning on 2 CPU ranks, alternating: per-step time and process start to
    first optimizer step (rank 0's clock; its children start from it)."""
    steps = bench.settings.ddp_steps
    runs = []
    for _ in range(bench.settings.repeats):
        results = {r: bench.timed_run("ddp", r, DDP_CASE, steps) for r in ("litlab", "lightning")}
        pair: dict[str, Any] = {}
        for runner, result in results.items():
            pair[f"{runner}_step_ms"] = median_ms(result)
            pair[f"{runner}_cpu_ms"] = median_ms(result, "step_cpu_ends")
            pair[f"{runner}_steps"] = len(result["step_ends"])
            pair[f"{runner}_first_step_s"] = result["first_step_unix"] - result["process_start_unix"]
        pair["litlab_vs_lightning"] = pair["litlab_step_ms"] / pair["lightning_step_ms"]
        # Rank 0's main-thread CPU time: what the two ranks' scheduling on shared cores does not change.
        pair["cpu_litlab_vs_lightning"] = pair["litlab_cpu_ms"] / pair["lightning_cpu_ms"]
        pair["startup_extra_s"] = pair["litlab_first_step_s"] - pair["lightning_first_step_s"]
        runs.append(pair)
    figures = ("litlab_step_ms", "lightning_step_ms", "litlab_vs_lightning", "cpu_litlab_vs_lightning")
    figures += ("litlab_first_step_s", "lightning_first_step_s", "startup_extra_s")
    return {
        "overrides": DDP_CASE,
        "steps": steps,
        "runs": runs,
        **{k: spread([r[k] for r in runs]) for k in figures},
    }


def sweep_section(bench: Bench) -> dict[str, Any]:
    """The default launcher's pool on this CPU: efficiency, a job's own-process cost, grid wall time."""
    settings = bench.settings
    result: dict[str, Any] = {}
    # Pool efficiency and own-process cost: one multirun on 2 devices, every job timed by its own
    # record (summary.json: sweep start/end) and its first optimizer step (the step timer).
    sweep_dir = bench.dir / "sweeps" / "pool"
    holds = ",".join(f"{h:g}" for h in settings.pool_holds)
    args = [
        "-m",
        "litlab.cli.train",
        "-m",
        "hydra.launcher.devices=2",
        f"+callbacks.hold._target_={HOLD_AFTER_TRAINING}",
        f"+callbacks.hold.seconds={holds}",
        f"+callbacks.bench_timer._target_={STEP_TIMER}",
        "+callbacks.bench_timer.path=${hydra:runtime.output_dir}/steps.json",
        *settings.pool_overrides,
        f"hydra.sweep.dir={sweep_dir}",
    ]
    probe = bench.dir / "sweeps" / "pool-imports" / "lightning"
    probe.parent.mkdir(parents=True, exist_ok=True)
    env = {
        "LITLAB_BENCH_LIGHTNING_IMPORTED": str(probe),
        "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks" / "import_probe"), bench.env["PYTHONPATH"]]),
    }
    _, sweep_s, _ = bench.process("sweep-pool", args, env=env)
    # When each process finished `import lightning`, by its job's run folder (in its command line).
    imported = {}
    for record in probe.parent.iterdir():
        data = json.loads(record.read_text())
        run_dir = next((a for a in data["argv"] if a.startswith("hydra.run.dir=")), None)
        if run_dir is not None:
            imported[Path(run_dir.split("=", 1)[1].strip('"')).name] = data["imported_unix"]
    jobs = []
    for summary_file in sorted(sweep_dir.glob("*/summary.json"), key=lambda p: int(p.parent.name)):
        summary = json.loads(summary_file.read_text())
        if summary["status"] != "completed":
            raise RuntimeError(f"{summary_file.parent}: {summary['status']}: {summary['error']}")
        steps = json.loads((summary_file.parent / "steps.json").read_text())
        # The pool's own record of the job (its devices, start and end): the sweep's, in .jobs/.
        pool = json.loads((sweep_dir / ".jobs" / f"{summary_file.parent.name}.json").read_text())
        pooled = pool["summary"]["sweep"]
        start, end = (_unix(pooled[k]) for k in ("start", "end"))
        jobs.append(
            {
                "hold_s": settings.pool_holds[int(summary_file.parent.name)],
                "devices": pooled["devices"],
                "start_s": start,
                "seconds": end - start,
                "first_step_s": steps["first_step_unix"] - start,
                "import_lightning_s": imported[summary_file.parent.resolve().name] - start,
                # What the job's own process costs beyond `import lightning`, in that process.
                "own_process_cost_s": steps["first_step_unix"] - imported[summary_file.parent.resolve().name],
            }
        )
    first_start = min(j["start_s"] for j in jobs)
    for job in jobs:
        job["start_s"] -= first_start
    makespan = max(j["start_s"] + j["seconds"] for j in jobs)
    lengths = [j["seconds"] for j in jobs]
    ideal = max(max(lengths), sum(lengths) / 2)
    result["pool"] = {
        "overrides": args[3:-1],
        "devices": 2,
        "jobs": jobs,
        "sweep_process_s": sweep_s,
        "makespan_s": makespan,
        "ideal_s": ideal,
        "efficiency": makespan / ideal,
        "import_lightning_s": spread([j["import_lightning_s"] for j in jobs]),
        "own_process_cost_s": spread([j["own_process_cost_s"] for j in jobs]),
    }
    # The 9-job grid: wall time of the whole multirun (sweep process start to exit).
    result["grid"] = {"overrides": list(settings.grid_overrides), "runs": {}}
    for devices in settings.grid_devices:
        sweep_dir = bench.dir / "sweeps" / f"grid-{devices}"
        args = ["-m", "litlab.cli.train", "-m", *settings.grid_overrides, f"hydra.launcher.devices={devices}"]
        _, seconds, _ = bench.process(f"sweep-grid-{devices}", [*args, f"hydra.sweep.dir={sweep_dir}"])
        statuses = [json.loads(p.read_text())["status"] for p in sweep_dir.glob("*/summary.json")]
        result["grid"]["runs"][str(devices)] = {
            "wall_s": seconds,
            "jobs": len(statuses),
            "statuses": statuses,
        }
    return result


def _unix(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


ACCELERATOR_SHAPES = {32: [3, 32, 32], 224: [3, 224, 224]}


def accelerator_section(bench: Bench, device: str | None) -> dict[str, Any]:
    """resnet18 on synthetic images per precision and accumulation, on CUDA (or the device asked for).

    Without CUDA it returns ``{"skipped": reason}``. ``device="cpu"`` runs the same code on a CPU,
    to try the section out on a machine without a GPU.
    """
    if device is None:
        reason = cuda_unavailable_reason()
        if reason:
            return {"skipped": reason}
        device = "cuda"
    settings = bench.settings
    results: dict[str, Any] = {"device": device, "runs": [], "probes": {}}
    for size, max_batch in settings.accelerator_max_batch.items():
        probe_file = bench.dir / "accelerator" / f"probe-{size}.json"
        probe_file.parent.mkdir(parents=True, exist_ok=True)
        probe_args = ["-m", "benchmarks.bench", "probe", str(probe_file), device, str(size), str(max_batch)]
        bench.process(f"probe-{size}", probe_args)
        probe = json.loads(probe_file.read_text())
        results["probes"][size] = probe
        for accumulation in settings.accelerator_accumulations:
            for precision in settings.accelerator_precisions:
                run = accelerator_run(bench, device, size, probe["max_batch"], precision, accumulation)
                run["flops_per_sample"] = probe["flops_per_sample"]
                results["runs"].append(run)
    compare_to_fp32(results["runs"])
    return results


def compare_to_fp32(runs: list[dict[str, Any]]) -> None:
    """Adds speed-up and memory ratios against the fp32 run of the same input and accumulation,
    and achieved TFLOP/s where the FLOPs per sample are known."""
    fp32 = {(r["size"], r["accumulation"]): r for r in runs if r["precision"] == "fp32" and "error" not in r}
    for run in runs:
        if "error" in run:
            continue
        baseline = fp32.get((run["size"], run["accumulation"]))
        if baseline is not None:
            run["speedup_vs_fp32"] = run["samples_per_s"] / baseline["samples_per_s"]
            if run["peak_memory_mib"] and baseline["peak_memory_mib"]:
                run["memory_vs_fp32"] = run["peak_memory_mib"] / baseline["peak_memory_mib"]
        if run.get("flops_per_sample"):
            run["tflops"] = run["samples_per_s"] * run["flops_per_sample"] / 1e12


def accelerator_overrides(device: str, size: int, batch: int, precision: str, accumulation: int) -> list[str]:
    """litlab-train overrides of one accelerator run: training steps only (no validation, test,
    logger or callbacks), 4 batches per epoch so that accumulation 4 never straddles an epoch end."""
    return [
        "model=resnet",
        "data=synthetic",
        f"data.image_shape=[{','.join(map(str, ACCELERATOR_SHAPES[size]))}]",
        f"model.net.small_inputs={str(size < 64).lower()}",  # 224x224 keeps resnet's strided stem
        f"data.num_samples={5 * batch}",  # 10 % val, 10 % test: 4 x batch training samples
        "data.val_fraction=0.1",
        "data.test_fraction=0.1",
        f"data.batch_size={batch}",
        f"precision={precision}",
        f"trainer.accumulate_grad_batches={accumulation}",
        f"trainer.accelerator={'gpu' if device == 'cuda' else device}",
        "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0",
        "trainer.enable_model_summary=false",
        "callbacks=none",
        "logger=none",
    ]


def accelerator_run(
    bench: Bench, device: str, size: int, batch: int, precision: str, accumulation: int
) -> dict[str, Any]:
    settings = bench.settings
    name = f"resnet-{size}-{precision}-acc{accumulation}"
    result_file = bench.dir / "accelerator" / f"{name}.json"
    overrides = [
        *accelerator_overrides(device, size, batch, precision, accumulation),
        *litlab_timing_overrides(result_file, settings.accelerator_steps, settings.accelerator_warmup),
    ]
    run: dict[str, Any] = {
        "size": size,
        "batch_size": batch,
        "precision": precision,
        "accumulation": accumulation,
        "data_mib": round(5 * batch * 3 * size * size * 4 / 2**20, 1),  # the dataset, on the device
    }
    _, _, status = bench.process(name, ["-m", "litlab.cli.train", *overrides], check=False)
    if status != 0:  # e.g. out of memory: the others still run
        run["error"] = f"exit status {status}, see {bench.output_log(name)}"
        return run
    timing = json.loads(result_file.read_text())
    window = timing["window"]
    run.update(
        {
            "samples_per_s": window["steps"] * batch * accumulation / window["seconds"],
            "step_ms": 1000 * window["seconds"] / window["steps"],
            "peak_memory_mib": timing["peak_memory_mib"],
            "effective_precision": timing["precision"],
            "backends": timing["backends"],
        }
    )
    return run


def cuda_unavailable_reason() -> str | None:
    """Why the accelerator section cannot run here, or None when CUDA is usable."""
    import torch

    if torch.version.cuda is None:
        return f"this torch build ({torch.__version__}) has no CUDA support"
    if not torch.cuda.is_available():
        return f"no CUDA device visible (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return None


def probe(out: Path, device: str, size: int, max_batch: int) -> None:
    """The largest power-of-two batch whose fp32 resnet18 training step fits on the device together
    with litlab's dataset (5 x batch images, held on the device), and the model's FLOPs per sample."""
    import torch
    from lightning.fabric.utilities.throughput import measure_flops

    from project.vision.nets import resnet18

    shape = ACCELERATOR_SHAPES[size]
    with torch.device("meta"):  # counts FLOPs without allocating anything
        net = resnet18(shape, 10, small_inputs=size < 64)
        x = torch.randn(2, *shape)
    flops_per_sample = measure_flops(net, lambda: net(x), lambda y: y.sum()) / 2  # forward + backward
    net = resnet18(shape, 10, small_inputs=size < 64).to(device)
    optimizer = torch.optim.AdamW(net.parameters())
    on_cuda = device.startswith("cuda")
    usable = 0.9 * torch.cuda.get_device_properties(device).total_memory if on_cuda else None
    sample_bytes = 4 * math.prod(shape)
    batch, chosen, peaks, tried = 8, 8, {}, []
    while batch <= max_batch:
        tried.append(batch)
        try:
            if on_cuda:
                torch.cuda.reset_peak_memory_stats(device)
            images = torch.randn(batch, *shape, device=device)
            labels = torch.zeros(batch, dtype=torch.long, device=device)
            torch.nn.functional.cross_entropy(net(images), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            images = labels = None
            if on_cuda:
                torch.cuda.empty_cache()
        if on_cuda:
            peaks[batch] = torch.cuda.max_memory_allocated(device)
            if peaks[batch] + 5 * batch * sample_bytes > usable:
                break
        chosen = batch
        batch *= 2
    result = {
        "max_batch": chosen,
        "tried_up_to": max_batch,
        "tried": tried,
        "flops_per_sample": flops_per_sample,
        "probe_peak_mib": {b: round(p / 2**20) for b, p in peaks.items()},
        "device_mib": round(usable / 0.9 / 2**20) if usable else None,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")


LOADERS = ("DataLoader", "ResumableDataLoader", "TensorBatches")
LOADER_TABLE = (20_000, 32, 64)  # rows, float features, batch size: a small tabular task in memory


def loader_rates(out: Path, epochs: int) -> None:
    """Samples/s of each loader (``LOADERS``) over one in-memory table, alone and feeding the training
    steps of a small MLP; each epoch of each loader in turn, the median of ``epochs``."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from litlab.data import ResumableDataLoader, TensorBatches

    rows, width, batch = LOADER_TABLE
    table = torch.randn(rows, width), torch.randint(0, 3, (rows,))
    loaders = {
        "DataLoader": DataLoader(TensorDataset(*table), batch_size=batch, shuffle=True),
        "ResumableDataLoader": ResumableDataLoader(TensorDataset(*table), batch_size=batch, shuffle=True),
        "TensorBatches": TensorBatches(table, batch, shuffle=True),
    }
    net = torch.nn.Sequential(torch.nn.Linear(width, 128), torch.nn.ReLU(), torch.nn.Linear(128, 3))
    optimizer = torch.optim.Adam(net.parameters())

    def epoch_rate(loader: Any, train: bool) -> float:
        started, samples = time.perf_counter(), 0
        for features, labels in loader:
            if train:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(net(features), labels).backward()
                optimizer.step()
            samples += len(labels)
        return samples / (time.perf_counter() - started)

    rates: dict[str, dict[str, list[float]]] = {name: {"alone": [], "training": []} for name in LOADERS}
    for _ in range(epochs):
        for mode in ("alone", "training"):
            for name, loader in loaders.items():
                rates[name][mode].append(epoch_rate(loader, mode == "training"))
    medians = {
        name: {mode: statistics.median(r) for mode, r in modes.items()} for name, modes in rates.items()
    }
    out.write_text(json.dumps({"table": LOADER_TABLE, "epochs": epochs, "samples_per_s": medians}) + "\n")


def loaders_section(bench: Bench) -> dict[str, Any]:
    """``loader_rates`` in a process of its own, with each loader's rate against the plain DataLoader's."""
    result_file = bench.dir / "loaders.json"
    bench.process(
        "loaders", ["-m", "benchmarks.bench", "loaders", str(result_file), str(bench.settings.loader_epochs)]
    )
    result = json.loads(result_file.read_text())
    plain = result["samples_per_s"]["DataLoader"]
    result["vs_dataloader"] = {
        name: {mode: rate / plain[mode] for mode, rate in modes.items()}
        for name, modes in result["samples_per_s"].items()
    }
    return result


# --- the report ------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The bench's tables (bench.md, printed, and pasted into the README)."""
    meta = result["machine"]
    lines = [
        f"litlab bench, {result['date']}: {meta['cpus']} CPU cores, {meta['threads']} torch threads, "
        f"torch {meta['torch']}, lightning {meta['lightning']}, python {meta['python']}"
        + (" (tiny mode: not representative)" if result["tiny"] else ""),
        "",
    ]
    cases = result.get("step")
    if cases:
        repeats = len(next(iter(cases.values()))["runs"])
        lines += [
            f"**Step time** (median ms per optimizer step after warm-up, {repeats} alternating repeats; "
            "bare Lightning: the same LightningModule and datamodule, built from the same config, in a "
            "plain Trainer with no logger, litlab callbacks or checkpointing; target for litlab / bare "
            f"Lightning: {LITLAB_VS_LIGHTNING_TARGET})",
            "",
            "| case | module | steps | plain PyTorch | bare Lightning | litlab | **litlab / bare Lightning** "
            "(min-max) | same, main-thread CPU time | bare Lightning / plain | litlab / plain (min-max) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, case in cases.items():
            own, cpu = case["litlab_vs_lightning"], case["cpu_litlab_vs_lightning"]
            ratio, floor = case["ratio"], case["lightning_ratio"]
            lines.append(
                f"| {name} | {case['runs'][0]['module']} | {case['steps']} | {case['plain_step_ms']:.2f} "
                f"| {case['lightning_step_ms']:.2f} | {case['litlab_step_ms']:.2f} "
                f"| **{own['median']:.3f}** ({own['min']:.3f}-{own['max']:.3f}) | {cpu['median']:.3f} "
                f"| {floor['median']:.2f} | {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}) |"
            )
        lines.append("")
        for name, case in cases.items():
            if not case.get("options"):
                continue
            lines += [
                f"**Options** ({name}; each beside the default litlab run of the same repeat)",
                "",
                "| option | ms per step | vs default (min-max) | same, main-thread CPU time | first step s "
                "| first step vs default |",
                "| --- | ---: | ---: | ---: | ---: | ---: |",
                f"| (default) | {case['litlab_step_ms']:.2f} | 1.00 | 1.00 | | |",
            ]
            for option, o in case["options"].items():
                ratio = o["vs_default"]
                lines.append(
                    f"| `{option}` | {o['step_ms']:.2f} "
                    f"| {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}) "
                    f"| {o['cpu_vs_default']['median']:.2f} "
                    f"| {o['first_step_s']:.1f} | {o['extra_first_step_s']:+.1f} s |"
                )
            lines.append("")
    startup = result.get("startup")
    if startup:
        labels = {
            "import_torch_s": "`import torch`: process start to imported",
            "import_torch_process_s": '`python -c "import torch"`, whole process (exit included)',
            "import_lightning_s": "`import lightning`: process start to imported",
            "import_lightning_process_s": '`python -c "import lightning"`, whole process (exit included)',
            "first_step_s": "`litlab-train` (default run): process start to first optimizer step",
            "first_step_after_lightning_import_s": "first step minus `import lightning` (litlab's own start)",
            "config_error_exit_s": "`litlab-train precision=fp61`: whole process, exit status 2",
        }
        lines += ["**Startup** (seconds)", "", "| measure | median | min-max |", "| --- | ---: | ---: |"]
        for key, label in labels.items():
            if key in startup:
                s = startup[key]
                lines.append(f"| {label} | {s['median']:.2f} | {s['min']:.2f}-{s['max']:.2f} |")
        lines.append("")
    ddp = result.get("ddp")
    if ddp:
        lines += [
            f"**DDP** (`{' '.join(ddp['overrides'])}`, 2 CPU ranks, {ddp['steps']} steps, {len(ddp['runs'])} "
            f"alternating repeats; target for litlab / bare Lightning: {LITLAB_VS_LIGHTNING_TARGET})",
            "",
            "| measure | median | min-max |",
            "| --- | ---: | ---: |",
        ]
        labels = {
            "lightning_step_ms": "bare Lightning: ms per optimizer step",
            "litlab_step_ms": "litlab: ms per optimizer step",
            "litlab_vs_lightning": "**litlab / bare Lightning**",
            "cpu_litlab_vs_lightning": "same, rank 0's main-thread CPU time",
            "lightning_first_step_s": "bare Lightning: process start to first step, s",
            "litlab_first_step_s": "litlab: process start to first step, s",
            "startup_extra_s": "litlab's 2-rank start minus bare Lightning's, s",
        }
        for key, label in labels.items():
            s = ddp[key]
            lines.append(f"| {label} | {s['median']:.3f} | {s['min']:.3f}-{s['max']:.3f} |")
        lines.append("")
    sweep = result.get("sweep")
    if sweep:
        pool, grid = sweep["pool"], sweep["grid"]
        cost = pool["own_process_cost_s"]
        lines += [
            f"**Sweep**: the pool of `hydra.launcher.devices=2`, {len(pool['jobs'])} jobs of unequal "
            f"lengths (`{' '.join(pool['overrides'])}`)",
            "",
            "| measure | value | target |",
            "| --- | ---: | ---: |",
            f"| makespan / ideal (max(longest, total / 2)) | {pool['efficiency']:.2f} "
            f"({pool['makespan_s']:.1f} / {pool['ideal_s']:.1f} s) | <= {POOL_EFFICIENCY_TARGET} |",
            f"| a job's own process: first step minus `import lightning` "
            f"(its own, median {pool['import_lightning_s']['median']:.2f} s), median (min-max) "
            f"| {cost['median']:.2f} ({cost['min']:.2f}-{cost['max']:.2f}) s "
            f"| <= {OWN_PROCESS_COST_TARGET_S} s |",
            "",
            f"`{' '.join(grid['overrides'])}`:",
            "",
            "| hydra.launcher.devices | jobs | wall s |",
            "| ---: | ---: | ---: |",
            *(f"| {d} | {r['jobs']} | {r['wall_s']:.1f} |" for d, r in grid["runs"].items()),
            "",
        ]
    loaders = result.get("loaders")
    if loaders:
        rows, width, batch = loaders["table"]
        lines += [
            f"**Loaders**: samples/s over {rows:,} rows of {width} floats in memory, batch {batch}, "
            f"one process (median of {loaders['epochs']} epochs each; training: a small MLP's Adam steps)",
            "",
            "| loader | alone | vs DataLoader | training | vs DataLoader |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for name, rate in loaders["samples_per_s"].items():
            ratio = loaders["vs_dataloader"][name]
            lines.append(
                f"| {name} | {rate['alone']:.0f} | {ratio['alone']:.2f} | {rate['training']:.0f} "
                f"| {ratio['training']:.2f} |"
            )
        lines.append("")
    accelerator = result.get("accelerator")
    if accelerator is not None:
        if "skipped" in accelerator:
            lines += [f"**Accelerator**: skipped: {accelerator['skipped']}", ""]
        else:
            lines += [
                f"**Accelerator** ({accelerator['device']}, resnet18 on synthetic images)",
                "",
                "| input | batch | precision | accumulation | samples/s | vs fp32 | peak MiB "
                "| vs fp32 | TFLOP/s |",
                "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            for run in accelerator["runs"]:
                if "error" in run:
                    lines.append(
                        f"| 3x{run['size']}x{run['size']} | {run['batch_size']} | {run['precision']} "
                        f"| {run['accumulation']} | failed: {run['error']} | | | | |"
                    )
                    continue
                lines.append(
                    f"| 3x{run['size']}x{run['size']} | {run['batch_size']} | {run['precision']} "
                    f"| {run['accumulation']} | {run['samples_per_s']:.0f} "
                    f"| {_x(run.get('speedup_vs_fp32'))} "
                    f"| {_number(run['peak_memory_mib'])} | {_x(run.get('memory_vs_fp32'))} "
                    f"| {_number(run.get('tflops'), '.1f')} |"
                )
            backends = next((r["backends"] for r in accelerator["runs"] if r.get("backends")), None)
            if backends:
                lines += ["", "Settings: " + ", ".join(f"`{k}={v}`" for k, v in backends.items())]
            lines.append("")
    return "\n".join(lines)


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _number(value: float | None, spec: str = ".0f") -> str:
    return "" if value is None else format(value, spec)


def machine(threads: int) -> dict[str, Any]:
    import platform
    from importlib.metadata import version

    return {
        "cpus": os.cpu_count(),
        "threads": threads,
        "python": platform.python_version(),
        "torch": version("torch"),
        "lightning": version("lightning"),
        "platform": platform.platform(),
    }


# --- entry points ----------------------------------------------------------------------------


SECTIONS = ("step", "loaders", "sweep", "ddp", "accelerator")


def run_bench(args: argparse.Namespace) -> Path:
    """Runs the chosen sections; returns the bench folder with bench.json and bench.md."""
    settings = Settings.tiny() if args.tiny else Settings()
    if args.repeats:
        settings.repeats = args.repeats
    if args.cases:
        settings.cases = tuple(args.cases.split(","))
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    bench_dir = Path(args.out or Path(os.environ.get("LITLAB_LOG_DIR", "logs")) / "bench" / stamp)
    bench_dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(bench_dir, settings, threads=args.threads)
    result: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "tiny": args.tiny,
        "machine": machine(args.threads),
        "settings": {k: v for k, v in vars(settings).items()},
    }
    sections = args.sections.split(",")
    if "step" in sections:
        result["step"], result["startup"] = step_and_startup_sections(bench)
    if "loaders" in sections:
        result["loaders"] = loaders_section(bench)
    if "sweep" in sections:
        result["sweep"] = sweep_section(bench)
    if "ddp" in sections:
        result["ddp"] = ddp_section(bench)
    if "accelerator" in sections:
        result["accelerator"] = accelerator_section(bench, args.accelerator_device)
        if "skipped" in result["accelerator"]:
            log.info("accelerator section skipped: %s", result["accelerator"]["skipped"])
    (bench_dir / "bench.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = markdown(result)
    (bench_dir / "bench.md").write_text(table + "\n")
    print(table)
    print(f"\nbench results: {bench_dir / 'bench.json'}")
    return bench_dir


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="litlab-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps of one case (for tests)")
    parser.add_argument("--repeats", type=int, default=None, help="alternating repeats (default 5)")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads of every run (OMP_NUM_THREADS)",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--cases", default=None, help=f"comma list of step cases: {', '.join(STEP_CASES)}")
    parser.add_argument("--out", default=None, help="bench folder (default logs/bench/<timestamp>)")
    parser.add_argument(
        "--accelerator-device",
        default=None,
        help="run the accelerator section on this device even without CUDA (cpu: to test the section)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}: choose from {', '.join(SECTIONS)}")
    unknown = set(args.cases.split(",")) - set(STEP_CASES) if args.cases else set()
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}: choose from {', '.join(STEP_CASES)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Console script ``litlab-bench``; ``plain``, ``loaders`` and ``probe`` are its measured children."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][bench] %(message)s")
    if argv[:1] in (["plain"], ["lightning"]):
        out, steps, warmup, *overrides = argv[1:]
        runner = plain_loop if argv[0] == "plain" else bare_lightning
        runner(overrides, int(steps), int(warmup), Path(out))
    elif argv[:1] == ["loaders"]:
        loader_rates(Path(argv[1]), int(argv[2]))
    elif argv[:1] == ["probe"]:
        out, device, size, max_batch = argv[1:]
        probe(Path(out), device, int(size), int(max_batch))
    else:
        run_bench(parse_args(argv))


if __name__ == "__main__":
    main()
