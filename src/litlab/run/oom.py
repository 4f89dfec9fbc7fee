"""Fit with a micro-batch that fits in memory: ``tune.batch_size=true`` runs Lightning's batch-size finder
first; ``oom=fail`` (default) ends an out-of-memory error in one line with the cures; ``oom=auto_shrink``
halves the micro-batch, doubles accumulation and fits again, under DDP only when every rank ran out of
memory in the same step. docs/troubleshooting.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.tuner import Tuner
from lightning.pytorch.utilities.memory import garbage_collection_cuda, is_oom_error
from omegaconf import DictConfig, OmegaConf

from litlab.callbacks.combined import parts_of
from litlab.config.redact import redact
from litlab.errors import EXIT_FAILED, LitlabError
from litlab.run.failures import every_rank_out_of_memory

if TYPE_CHECKING:
    import lightning as L

    from litlab.run.lifecycle import Run

log = logging.getLogger("litlab")

Built = tuple["L.Trainer", "L.LightningModule", "L.LightningDataModule"]
# Trainer arguments counted in micro-batches: doubled with every halving of the micro-batch.
_BATCH_COUNTS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "val_check_interval")


class _OutOfMemory(LitlabError):
    exit_code = EXIT_FAILED


def fit(cfg: DictConfig, run: Run, build: Callable[[DictConfig, Run], Built]) -> Built:
    """Build the Trainer, module and data and fit them; summary.json records a failure."""
    if cfg.tune.batch_size:
        _tune_batch_size(cfg, run, build)
    tried: list[int] = []
    while True:
        trainer, module, data = build(cfg, run)
        tried.append(run.batch_sizes.micro)
        with run.recording_failure(cfg, trainer):
            try:
                trainer.fit(module, datamodule=data, ckpt_path=run.resume_from, weights_only=True)
            except RuntimeError as error:  # torch.cuda.OutOfMemoryError is one
                if not is_oom_error(error):
                    raise
                _shrink_or_raise(cfg, run, trainer, error, shrinks=len(tried) - 1)
            else:
                if cfg.oom.action == "auto_shrink":
                    sizes = run.batch_sizes
                    run.extra["oom"] = {
                        "action": cfg.oom.action,
                        "shrinks": len(tried) - 1,
                        "tried_micro_batch_sizes": tried,
                        "micro_batch_size": sizes.micro,
                        "accumulate_grad_batches": sizes.accumulation,
                    }
                    if len(tried) > 1:
                        log.info(
                            "oom=auto_shrink: micro-batch %d x accumulation %d fits (effective batch %d)",
                            sizes.micro,
                            sizes.accumulation,
                            sizes.effective,
                        )
                return trainer, module, data
        # Here the error, and the frames that held its tensors, are gone: free the cache and retry.
        del trainer, module, data
        garbage_collection_cuda()
        _halve_micro_batch(cfg)
        if run.is_global_zero:
            run.storage.write_text("config.yaml", OmegaConf.to_yaml(redact(cfg)))


def _tune_batch_size(cfg: DictConfig, run: Run, build: Callable[[DictConfig, Run], Built]) -> None:
    """Sets ``data.batch_size`` to what Lightning's batch-size finder picks on a throwaway Trainer."""
    tune, initial = cfg.tune, cfg.data.batch_size
    # Every loader, the validation one included, starts at init_val (the finder resizes only the ones
    # it resets, so a loader made at the configured size could fail the first trial on its own).
    cfg.data.batch_size = tune.init_val
    trainer, module, data = build(cfg, run)
    for callback in parts_of(trainer.callbacks):  # no progress lines for the trials (Lightning's tuner
        if isinstance(callback, ProgressBar):  # silences only the progress bar it finds by type)
            callback.disable()
    with run.recording_failure(cfg, trainer):
        settings = {
            key: tune[key] for key in ("mode", "init_val", "max_trials", "steps_per_trial", "max_val")
        }
        found = Tuner(trainer).scale_batch_size(module, datamodule=data, **settings)
    del trainer, module, data
    garbage_collection_cuda()
    cfg.data.batch_size = int(found)
    run.extra["tune"] = {"batch_size": int(found), "initial_batch_size": initial, "mode": tune.mode}
    log.info("tune: the batch-size finder (%s mode) picked data.batch_size=%d", tune.mode, found)


def advice(cfg: DictConfig, run: Run, step: int, error: BaseException, why_not: str) -> str:
    """One sentence: where memory ran out, and which changes would help this run."""
    sizes = run.batch_sizes
    options = []
    halvable = (sizes.micro or 0) > 1  # None: a datamodule without batch_size sizes its own batches
    if halvable:
        if cfg.get("global_batch_size") is None:
            options.append(
                f"a smaller micro-batch with more accumulation (data.batch_size={sizes.micro // 2} "
                f"trainer.accumulate_grad_batches={sizes.accumulation * 2} keeps the effective batch "
                f"{sizes.effective})"
            )
        else:
            options.append(
                f"more accumulation (trainer.accumulate_grad_batches={sizes.accumulation * 2} halves the "
                f"micro-batch to {sizes.micro // 2}; global_batch_size stays {cfg.get('global_batch_size')})"
            )
    if cfg.precision.value == "32-true":
        options.append("precision=bf16 (or precision=fp16 on GPUs without bfloat16) to halve activations")
    if cfg.oom.action == "fail" and halvable:
        options.append("oom=auto_shrink to halve the micro-batch automatically")
    if not options:
        options.append("a smaller model or a GPU with more memory")
    torch_says = str(error).strip().split(". ")[0][:120]
    tried = ", ".join(options[:-1]) + (" or " if len(options) > 1 else "") + options[-1]
    where = f"global step {step}" + (f" with micro-batch {sizes.micro}" if sizes.micro else "")
    return f"out of memory at {where} ({torch_says}){why_not}; try {tried}"


def _shrink_or_raise(
    cfg: DictConfig, run: Run, trainer: L.Trainer, error: BaseException, shrinks: int
) -> None:
    """Raises the error's one-line advice, unless oom=auto_shrink halves the micro-batch and fits again."""
    oom, micro, step = cfg.oom, run.batch_sizes.micro, trainer.global_step
    if oom.action != "auto_shrink":
        why_not = ""
    elif shrinks >= oom.max_shrinks:
        why_not = f" after {shrinks} halvings (oom.max_shrinks={oom.max_shrinks})"
    elif step >= oom.within_steps:
        why_not = (
            f", after the first {oom.within_steps} steps that oom=auto_shrink retries (oom.within_steps)"
        )
    elif micro % 2:
        why_not = f", and micro-batch {micro} is odd: halving it would change the effective batch"
    elif not every_rank_out_of_memory(step, shrinks + 1):
        why_not = (
            f" on rank {trainer.global_rank} only (oom=auto_shrink shrinks only when every rank "
            "runs out of memory in the same step, so that all keep one micro-batch)"
        )
    else:
        log.warning(
            "out of memory at global step %d with micro-batch %d: retrying with %d "
            "(oom=auto_shrink, halving %d of at most %d)",
            step,
            micro,
            micro // 2,
            shrinks + 1,
            oom.max_shrinks,
        )
        return
    raise _OutOfMemory(advice(cfg, run, step, error, why_not)) from error


def _halve_micro_batch(cfg: DictConfig) -> None:
    if cfg.get("global_batch_size") is None:  # otherwise the micro-batch is derived from accumulation
        cfg.data.batch_size //= 2
    cfg.trainer.accumulate_grad_batches = cfg.trainer.get("accumulate_grad_batches", 1) * 2
    for key in _BATCH_COUNTS:
        value = cfg.trainer.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            cfg.trainer[key] = value * 2
