"""``python -m benchmarks.calls``: the Python calls per step that litlab adds to bare Lightning, by part.

Noise-free where step times are not (this VM's speed jumps between runs, see docs/performance.md):
cProfile counts every call of a window of steps inside the first epoch (no validation, no epoch-end
checkpoint in it) of one fit of the case's own module and datamodule, built from its config as
litlab-train builds them, by a plain ``lightning.Trainer``: first with none of litlab's parts (bare
Lightning, as ``make bench`` runs it), then with each of the callbacks litlab-train adds, and the
logger, one at a time, then with all of them together. All in this process, one after the other.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench import STEP_CASES

log = logging.getLogger("benchmarks.calls")
WINDOW = (5, 55)  # optimizer steps counted: from the end of step 5 to the end of step 55, or the epoch's end


def count(case: str, window: tuple[int, int] = WINDOW) -> dict[str, Any]:
    """Calls per step of bare Lightning, what each part of litlab adds to it, and all of litlab."""
    import lightning as L
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from lightning.pytorch.callbacks import Callback, Checkpoint, ProgressBar
    from omegaconf import OmegaConf, open_dict

    from litlab.config import preflight, schema
    from litlab.config.rules import batch_sizes
    from litlab.run.build import build_callbacks, build_datamodule, build_loggers, build_module
    from litlab.run.lifecycle import Run
    from litlab.storage.checkpoints import AtomicCheckpointIO
    from litlab.storage.roots import RunStorage

    folder = Path(tempfile.mkdtemp(prefix="litlab-calls-"))
    schema.register()
    with initialize_config_dir(config_dir=str(preflight.CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=STEP_CASES[case], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(folder)  # the config interpolates these two
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    run = Run(dir=folder, identity="calls", storage=RunStorage(str(folder / "storage"), "calls"))

    class CallCounter(Callback):
        def __init__(self) -> None:
            self.profile, self.per_step, self.window = cProfile.Profile(), 0.0, window

        def on_train_start(self, trainer, pl_module) -> None:  # stay inside the first epoch
            self.window = (window[0], min(window[1], trainer.num_training_batches - 1))

        def on_train_batch_end(self, trainer, *args: Any) -> None:
            start, stop = self.window
            if trainer.global_step == start:
                self.profile.enable()
            elif trainer.global_step == stop:
                self.profile.disable()
                self.per_step = sum(entry.callcount for entry in self.profile.getstats()) / (stop - start)
                trainer.should_stop = True

    data = build_datamodule(cfg, batch_sizes(cfg.data, cfg.trainer).micro)  # loaded once, for every fit

    def calls_per_step(callbacks: list[Any], logger: Any = False, plugins: Any = None) -> float:
        L.seed_everything(cfg.seed, verbose=False)
        counter = CallCounter()
        trainer_args = {
            **OmegaConf.to_container(cfg.trainer, resolve=True),
            "max_epochs": 1,
            "num_sanity_val_steps": 0,
            "enable_model_summary": False,
        }
        trainer = L.Trainer(
            **trainer_args,
            logger=logger,
            enable_checkpointing=any(isinstance(c, Checkpoint) for c in callbacks),
            enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
            callbacks=[counter, *callbacks],
            default_root_dir=str(folder),
            plugins=plugins,
        )
        trainer.fit(build_module(cfg), datamodule=data)
        return counter.per_step

    def everything() -> float:
        return calls_per_step(build_callbacks(cfg, run), build_loggers(cfg, run), [AtomicCheckpointIO()])

    everything()  # once before counting: the first use of a part in a process also imports and caches
    bare = calls_per_step([])
    parts: dict[str, float] = {}
    for callback in build_callbacks(cfg, run):
        name = type(callback).__name__
        # Lightning refuses a LearningRateMonitor without a logger: it is counted with one, less the logger's.
        logger = build_loggers(cfg, run) if name == "LearningRateMonitor" else False
        parts[name] = calls_per_step([callback], logger) - bare
    parts["logger"] = calls_per_step([], build_loggers(cfg, run)) - bare
    if "LearningRateMonitor" in parts:
        parts["LearningRateMonitor"] -= parts["logger"]
    litlab = everything()
    no_op = Callback()  # what Lightning's dispatch alone costs: a callback with no hook of its own
    return {
        "case": case,
        "bare_lightning": bare,
        "parts": parts,
        "one_callback_that_does_nothing": calls_per_step([no_op]) - bare,
        "litlab": litlab,
    }


def markdown(results: list[dict[str, Any]]) -> str:
    """One table: a row per part of litlab, a column per case."""
    cases = [r["case"] for r in results]
    lines = [
        "| Python calls per optimizer step | " + " | ".join(cases) + " |",
        "| --- |" + " ---: |" * len(cases),
        "| bare Lightning | " + " | ".join(f"{r['bare_lightning']:.0f}" for r in results) + " |",
    ]
    for part in results[0]["parts"]:
        lines.append(f"| + {part} | " + " | ".join(f"{r['parts'][part]:+.0f}" for r in results) + " |")
    lines += [
        "| (+ a callback that does nothing) | "
        + " | ".join(f"{r['one_callback_that_does_nothing']:+.0f}" for r in results)
        + " |",
        "| litlab-train's Trainer (all of the above) | "
        + " | ".join(f"{r['litlab']:.0f} (x{r['litlab'] / r['bare_lightning']:.2f})" for r in results)
        + " |",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calls", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", default="cnn-digits,char_lm", help=f"comma list of {', '.join(STEP_CASES)}"
    )
    args = parser.parse_args(argv)
    unknown = set(args.cases.split(",")) - set(STEP_CASES)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}: choose from {', '.join(STEP_CASES)}")
    logging.basicConfig(level=logging.WARNING)
    print(markdown([count(case) for case in args.cases.split(",")]))


if __name__ == "__main__":
    main()
