"""``python -m benchmarks.overhead``: where litlab's per-step time goes, against bare Lightning.

``make bench`` times whole processes, and on a shared VM whose speed jumps between runs (see
docs/performance.md) a few percent drown in the noise. This looks closer, in one process: the case's
own module and datamodule, built from its config as litlab-train builds them, fitted by a plain
``lightning.Trainer`` again and again, with a window of steps inside the first epoch measured (no
validation, no epoch-end checkpoint in it):

- calls: cProfile counts every Python call of the window (noise-free), for bare Lightning (as
  ``make bench`` runs it), then with each callback litlab-train adds, and the logger, one at a time,
  then with all of them together (litlab-train's Trainer);
- paired: bare Lightning and litlab-train's Trainer, alternating, ``--repeats`` times: the median
  main-thread CPU time per step of each, and their ratio per pair.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import logging
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench import STEP_CASES

WINDOW = (5, 55)  # optimizer steps measured: from the end of step 5 to the end of step 55, or the epoch's end


class Fits:
    """The case's config, run and datamodule, and fits of its module by a plain Trainer."""

    def __init__(self, case: str) -> None:
        from hydra import compose, initialize_config_dir
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import open_dict

        from litlab.config import preflight, schema
        from litlab.config.rules import batch_sizes
        from litlab.run.build import build_datamodule
        from litlab.run.lifecycle import Run
        from litlab.storage.roots import RunStorage

        self.folder = Path(tempfile.mkdtemp(prefix="litlab-overhead-"))
        schema.register()
        with initialize_config_dir(config_dir=str(preflight.CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=STEP_CASES[case], return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(self.folder)  # the config interpolates these two
            cfg.hydra.job.num = 0
        HydraConfig.instance().set_config(cfg)
        self.cfg = cfg
        self.run = Run(dir=self.folder, identity="overhead", storage=RunStorage(str(self.folder / "s"), "o"))
        self.data = build_datamodule(cfg, batch_sizes(cfg.data, cfg.trainer).micro)  # loaded once

    def litlab_parts(self) -> tuple[list[Any], Any, list[Any], Any]:
        """(callbacks, loggers, plugins, profiler) of litlab-train's Trainer, built as litlab-train
        builds them (its callbacks partly combined into one, ``litlab.callbacks.combined``)."""
        from litlab.run.build import NoProfiler, build_callbacks, build_loggers
        from litlab.storage.checkpoints import AtomicCheckpointIO

        callbacks = build_callbacks(self.cfg, self.run)
        return callbacks, build_loggers(self.cfg, self.run), [AtomicCheckpointIO()], NoProfiler()

    def separate_parts(self) -> list[Any]:
        """litlab-train's callbacks one by one, as they were before they ran combined."""
        from litlab.callbacks.combined import parts_of

        return parts_of(self.litlab_parts()[0])

    def loggers(self) -> Any:
        from litlab.run.build import build_loggers

        return build_loggers(self.cfg, self.run)

    def fit(
        self,
        probe: Any,
        callbacks: Sequence[Any] = (),
        logger: Any = False,
        plugins: Any = None,
        profiler: Any = None,
    ) -> None:
        """One fit of a fresh module up to the end of ``probe``'s window."""
        import lightning as L
        from lightning.pytorch.callbacks import Checkpoint, ProgressBar
        from omegaconf import OmegaConf

        from litlab.run.build import build_module

        L.seed_everything(self.cfg.seed, verbose=False)
        trainer_args = {
            **OmegaConf.to_container(self.cfg.trainer, resolve=True),
            "max_epochs": 1,
            "num_sanity_val_steps": 0,
            "enable_model_summary": False,
            "profiler": profiler,
        }
        trainer = L.Trainer(
            **trainer_args,
            logger=logger,
            enable_checkpointing=any(isinstance(c, Checkpoint) for c in callbacks),  # as build_trainer
            enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
            callbacks=[probe, *callbacks],
            default_root_dir=str(self.folder),
            plugins=plugins,
        )
        trainer.fit(build_module(self.cfg), datamodule=self.data)


def window_probe(window: tuple[int, int], count_calls: bool) -> Any:
    """A callback that, over ``window`` (clipped to the first epoch), counts Python calls per step
    (``count_calls``) or records when each step ends, then stops the fit."""
    from lightning.pytorch.callbacks import Callback

    class WindowProbe(Callback):
        def __init__(self) -> None:
            self.profile = cProfile.Profile() if count_calls else None
            self.window, self.calls_per_step = window, 0.0
            self.step_ends: dict[str, list[float]] = {"cpu": [], "wall": []}

        def on_train_start(self, trainer, pl_module) -> None:
            self.window = (window[0], min(window[1], trainer.num_training_batches - 1))

        def on_train_batch_end(self, trainer, *args: Any) -> None:
            start, stop = self.window
            step = trainer.global_step
            if start <= step <= stop and not count_calls:
                self.step_ends["cpu"].append(time.thread_time())  # main thread: least disturbed by others
                self.step_ends["wall"].append(time.perf_counter())
            if step == start and self.profile is not None:
                gc.disable()  # a collection's finalizers are Python calls of whatever the process holds
                self.profile.enable()
            if step == stop:
                if self.profile is not None:
                    self.profile.disable()
                    gc.enable()
                    calls = sum(entry.callcount for entry in self.profile.getstats())
                    self.calls_per_step = calls / (stop - start)
                trainer.should_stop = True

        def median_ms(self, clock: str) -> float:
            ends = self.step_ends[clock]
            return 1000 * statistics.median(b - a for a, b in zip(ends[:-1], ends[1:], strict=True))

    return WindowProbe()


def count(case: str, window: tuple[int, int] = WINDOW) -> dict[str, Any]:
    """Calls per step of bare Lightning, what each part of litlab-train's Trainer adds on its own
    (each callback as a callback of its own, as Lightning would dispatch it), and litlab-train's
    Trainer itself (its callbacks partly combined, ``NoProfiler``)."""
    from lightning.pytorch.callbacks import Callback

    from litlab.run.build import NoProfiler

    fits = Fits(case)

    def calls(callbacks: Sequence[Any] = (), logger: Any = False, plugins: Any = None, profiler: Any = None):
        probe = window_probe(window, count_calls=True)
        fits.fit(probe, callbacks, logger, plugins, profiler)
        return probe.calls_per_step

    calls(*fits.litlab_parts())  # once before counting: a part's first use in a process imports and caches
    bare, quiet = calls(), calls(profiler=NoProfiler())
    parts: dict[str, float] = {}
    for callback in fits.separate_parts():
        name = type(callback).__name__
        # Lightning refuses a LearningRateMonitor without a logger: counted with one, less the logger's.
        logger = fits.loggers() if name == "LearningRateMonitor" else False
        parts[name] = calls([callback], logger) - bare
    parts["logger"] = calls([], fits.loggers()) - bare
    if "LearningRateMonitor" in parts:
        parts["LearningRateMonitor"] -= parts["logger"]
    return {
        "case": case,
        "bare_lightning": bare,
        "parts": parts,
        # What Lightning's dispatch alone costs: a callback with no hook of its own.
        "one_callback_that_does_nothing": calls([Callback()]) - bare,
        # litlab's profiler (``NoProfiler``), alone and with that callback.
        "no_profiler": quiet - bare,
        "one_callback_with_no_profiler": calls([Callback()], profiler=NoProfiler()) - quiet,
        # Before litlab combined its callbacks and passed NoProfiler.
        "separate": calls(fits.separate_parts(), *fits.litlab_parts()[1:3]),
        "litlab": calls(*fits.litlab_parts()),
    }


def paired(case: str, repeats: int, window: tuple[int, int] = WINDOW) -> dict[str, Any]:
    """Median ms per step (main-thread CPU time, and wall time) of bare Lightning and of
    litlab-train's Trainer, fitted alternately ``repeats`` times after one unmeasured fit of each,
    and their ratio per pair. With one torch thread (OMP_NUM_THREADS=1) the main thread does all of
    a step's work, and its CPU time is the steadiest measure on a shared machine."""
    import torch

    fits = Fits(case)
    times: dict[str, dict[str, list[float]]] = {
        clock: {"bare_lightning": [], "litlab": []} for clock in ("cpu", "wall")
    }
    for repeat in range(repeats + 1):
        for runner, parts in (("bare_lightning", ((), False, None, None)), ("litlab", fits.litlab_parts())):
            probe = window_probe(window, count_calls=False)
            fits.fit(probe, *parts)
            for clock, runs in times.items():
                if repeat:  # the first round warms up (imports, caches, the allocator)
                    runs[runner].append(probe.median_ms(clock))
    result: dict[str, Any] = {"case": case, "repeats": repeats, "threads": torch.get_num_threads()}
    for clock, runs in times.items():
        ratios = [a / b for a, b in zip(runs["litlab"], runs["bare_lightning"], strict=True)]
        result[clock] = {
            "ms": {runner: statistics.median(values) for runner, values in runs.items()},
            "runs": runs,
            "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        }
    return result


def markdown(counted: list[dict[str, Any]], timed: list[dict[str, Any]]) -> str:
    """A table of calls (a row per part of litlab, a column per case), then one of paired times."""
    lines: list[str] = []
    if counted:
        cases = [r["case"] for r in counted]
        lines += [
            "| Python calls per optimizer step | " + " | ".join(cases) + " |",
            "| --- |" + " ---: |" * len(cases),
            "| bare Lightning | " + " | ".join(f"{r['bare_lightning']:.0f}" for r in counted) + " |",
        ]
        for part in counted[0]["parts"]:
            lines.append(f"| + {part} | " + " | ".join(f"{r['parts'][part]:+.0f}" for r in counted) + " |")

        def row(label: str, key: str) -> str:
            return f"| {label} | " + " | ".join(f"{r[key]:+.0f}" for r in counted) + " |"

        def total(key: str) -> str:
            return " | ".join(f"{r[key]:.0f} (x{r[key] / r['bare_lightning']:.2f})" for r in counted)

        lines += [
            row("(+ a callback that does nothing)", "one_callback_that_does_nothing"),
            row("(NoProfiler instead of Lightning's default)", "no_profiler"),
            row("(+ a callback that does nothing, with NoProfiler)", "one_callback_with_no_profiler"),
            f"| all parts, each a callback of its own, default profiler | {total('separate')} |",
            f"| litlab-train's Trainer (combined callbacks, NoProfiler) | {total('litlab')} |",
            "",
        ]
    if timed:
        lines += [
            "| case | torch threads | repeats | clock | bare Lightning ms/step | litlab-train's Trainer "
            "| litlab / bare Lightning (min-max) |",
            "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
        ]
        for r in timed:
            for clock, label in (("cpu", "main-thread CPU"), ("wall", "wall")):
                ratio, ms = r[clock]["ratio"], r[clock]["ms"]
                lines.append(
                    f"| {r['case']} | {r['threads']} | {r['repeats']} | {label} | {ms['bare_lightning']:.3f} "
                    f"| {ms['litlab']:.3f} "
                    f"| **{ratio['median']:.3f}** ({ratio['min']:.3f}-{ratio['max']:.3f}) |"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.overhead", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--cases", default="cnn-digits,char_lm", help=f"comma list of {', '.join(STEP_CASES)}"
    )
    parser.add_argument("--sections", default="calls,paired", help="comma list of calls, paired")
    parser.add_argument("--repeats", type=int, default=8, help="alternating pairs of fits (paired)")
    args = parser.parse_args(argv)
    cases, sections = args.cases.split(","), args.sections.split(",")
    unknown = set(cases) - set(STEP_CASES)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}: choose from {', '.join(STEP_CASES)}")
    if set(sections) - {"calls", "paired"}:
        parser.error(f"unknown section(s) in {args.sections}: choose from calls, paired")
    logging.basicConfig(level=logging.WARNING)
    counted = [count(case) for case in cases] if "calls" in sections else []
    timed = [paired(case, args.repeats) for case in cases] if "paired" in sections else []
    print(markdown(counted, timed))


if __name__ == "__main__":
    main()
