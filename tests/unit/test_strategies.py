"""Every strategy x precision x accelerator combination, on this CPU-only machine: it trains, or it is
refused in one line naming the options and what to use instead (an accelerator this machine lacks
says which hardware it needs).

The decision (``litlab.run.combinations.check_combination``) is walked for all combinations, and for
every accepted one Lightning builds the Trainer (the decision agrees with Lightning). The accepted
single-process combinations train here, in-process, with tiny settings; the multi-process ones are
sampled by tests/integration/test_strategies.py (and by every DDP test).
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import lightning as L
import pytest
from omegaconf import DictConfig

from litlab.callbacks.nonfinite import NonFiniteLoss
from litlab.cli.api import train_run
from litlab.config.rules import ACCELERATORS
from litlab.errors import LitlabError
from litlab.run.build import build_strategy
from litlab.run.combinations import available_devices, check_combination, trainer_errors
from tests.conftest import TINY, compose_train, option_names

STRATEGIES, PRECISIONS = option_names("strategy"), option_names("precision")
HARDWARE = {"gpu": "GPU", "cuda": "GPU", "mps": "Apple GPU (MPS)", "tpu": "TPU"}

pytestmark = pytest.mark.skipif(
    available_devices() != {"cpu"}, reason="the expected outcomes are those of a CPU-only machine"
)


@functools.cache
def composed(strategy: str, precision: str) -> DictConfig:
    devices = "1" if strategy == "auto" else "2"
    overrides = [f"strategy={strategy}", f"precision={precision}", f"trainer.devices={devices}"]
    return compose_train(overrides, Path("unused"))


def compose(strategy: str, precision: str, accelerator: str) -> DictConfig:
    cfg = composed(strategy, precision).copy()  # one composition per strategy x precision: 20, not 120
    cfg.trainer.accelerator = accelerator
    return cfg


def expected_refusal(strategy: str, accelerator: str) -> str | None:
    """What this machine (CPU only) refuses, by the option to blame."""
    if accelerator in HARDWARE:
        return f"trainer.accelerator={accelerator}"
    if strategy == "fsdp":
        return f"strategy={strategy}"
    return None


@pytest.mark.parametrize(
    ("strategy", "precision", "accelerator"), list(itertools.product(STRATEGIES, PRECISIONS, ACCELERATORS))
)
def test_every_combination_builds_or_is_refused_naming_the_options_and_what_to_use(
    strategy, precision, accelerator
):
    cfg = compose(strategy, precision, accelerator)
    blamed = expected_refusal(strategy, accelerator)
    if blamed is None:
        check_combination(cfg.trainer, cfg.strategy)
        with trainer_errors(cfg.trainer, cfg.strategy, cfg.precision):  # Lightning agrees
            trainer = L.Trainer(
                accelerator=accelerator,
                devices=cfg.trainer.devices,
                strategy=build_strategy(cfg.strategy),
                precision=cfg.precision.value,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
            )
        assert trainer.strategy.root_device.type == "cpu"
        return
    with pytest.raises(LitlabError) as refused:
        check_combination(cfg.trainer, cfg.strategy)
    line = str(refused.value)
    assert line.startswith("litlab: error: ") and "\n" not in line
    assert blamed in line and "use " in line, line
    if accelerator in HARDWARE:
        assert HARDWARE[accelerator] in line and "use trainer.accelerator=cpu" in line, line
    else:
        assert "needs GPUs" in line and "strategy=ddp" in line, line


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_ranks_started_by_spawn_are_refused_in_one_line(start_method):
    # Their progress never reaches the process that writes summary.json: it would say "completed"
    # with none of their steps (ddp_spawn, removed, was refused for it).
    cfg = compose("ddp", "fp32", "cpu")
    cfg.strategy.start_method = start_method
    with pytest.raises(
        LitlabError, match=f"strategy.start_method={start_method} is not supported: .*strategy=ddp"
    ):
        check_combination(cfg.trainer, cfg.strategy)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_trains_on_this_cpu_or_ends_in_one_line_naming_it(tmp_path, precision):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = compose_train([f"paths.log_dir={tmp_path / 'logs'}", f"precision={precision}", *TINY], run_dir)
    if precision != "fp16_true":
        train_run(cfg)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["global_step"] == 4
        return
    # float16 weights and AdamW state: eps=1e-8 is 0 in float16, the first update is not finite.
    with pytest.raises(NonFiniteLoss) as failed:  # in-process it is raised; litlab-train prints it
        train_run(cfg)
    line = str(failed.value)
    assert line.startswith("litlab: error: at global step 1") and "the loss is nan" in line, line
    assert "precision=fp16_true keeps weights and optimizer state in float16" in line
    assert "use precision=bf16_true or fp16 (mixed)" in line
