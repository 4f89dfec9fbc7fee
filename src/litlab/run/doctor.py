"""The run doctor: what a run's own numbers in summary.json (its history, skipped steps, input wait,
peak CUDA memory) show, with the usual cures. Each finding is a WARNING at the run's end, an entry of
``diagnosis`` in summary.json and a line of the sweep report. The thresholds: docs/troubleshooting.md.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from litlab.run.summary import Summary, finite

log = logging.getLogger("litlab")

_PATIENCE = 3  # epochs the metric must have been worse than its best
_OVERFIT_MARGIN = 0.05  # "worse": by more than this share of what the run had gained by its best epoch
_TRAIN_LOSS_FELL = 0.9  # "falling": the training loss ends below this share of its value at the best epoch
_UNDERFIT_START_SHARE = 0.8  # "poor": the training loss ends above this share of its value at the first steps
_UNDERFIT_FLAT = 0.02  # "flat": the metric moved by at most this share of its value
_UNDERFIT_LOSS_FLAT = 0.9  # "flat": the training loss ends above this share of its first epoch's
_MIN_EPOCHS = 3  # fewer epochs than this say nothing about the trend
INPUT_BOUND_SHARE = 0.5
MIN_MEASURED_BATCHES = 10
_SMALL_BATCH_MEMORY_SHARE = 0.2


@dataclass
class _Finding:
    symptom: str
    evidence: str  # what the run's numbers show
    cures: str  # the usual cures, as the settings to change


def diagnose(summary: Summary) -> list[dict[str, Any]]:
    """Every finding of the run's numbers, as summary.json's ``diagnosis`` entries."""
    return [asdict(finding) for check in _CHECKS if (finding := check(summary)) is not None]


def warn(diagnosis: list[dict[str, Any]]) -> None:
    """One WARNING line per finding."""
    for entry in diagnosis:
        log.warning("doctor: %s: %s. Usual cures: %s", entry["symptom"], entry["evidence"], entry["cures"])


def _validated_epochs(summary: Summary) -> list[dict[str, Any]]:
    """History entries with a finite monitored metric and training loss."""
    name = summary.optimized_metric
    return [
        entry
        for entry in summary.history or []
        if finite((entry.get("metrics") or {}).get(name)) and finite(entry.get("train_loss"))
    ]


def _overfitting(summary: Summary) -> _Finding | None:
    epochs = _validated_epochs(summary)
    if len(epochs) < _PATIENCE + 2:
        return None
    name = summary.optimized_metric
    values = [entry["metrics"][name] for entry in epochs]
    higher_is_better = summary.optimized_metric_mode != "min"
    best_index = values.index(max(values) if higher_is_better else min(values))
    best, since_best = values[best_index], epochs[best_index + 1 :]
    if len(since_best) < _PATIENCE:
        return None
    margin = max(_OVERFIT_MARGIN * abs(values[0] - best), 0.01 * abs(best), 1e-12)
    recent = values[-_PATIENCE:]
    worse = all((best - v if higher_is_better else v - best) > margin for v in recent)
    loss_at_best, loss_now = epochs[best_index]["train_loss"], epochs[-1]["train_loss"]
    if not worse or loss_now >= _TRAIN_LOSS_FELL * loss_at_best:
        return None
    return _Finding(
        "overfitting",
        f"{name} was best at epoch {epochs[best_index]['epoch']} ({best:.4g}) and worse in the "
        f"{len(since_best)} epochs since (now {values[-1]:.4g}), while the training loss fell from "
        f"{loss_at_best:.4g} to {loss_now:.4g}",
        "more data or augmentation (data.augment), more regularisation (dropout, optimizer.weight_decay), "
        "a smaller network, or early stopping (callbacks=early_stopping); the best checkpoint is kept "
        "(summary.json checkpoints.best)",
    )


def _underfitting(summary: Summary) -> _Finding | None:
    epochs = _validated_epochs(summary)
    history = summary.history or []
    start = history[0].get("train_loss_start") if history else None
    if len(epochs) < _MIN_EPOCHS or not finite(start) or start <= 0:
        return None
    name = summary.optimized_metric
    first, last = epochs[0], epochs[-1]
    loss_poor = last["train_loss"] >= _UNDERFIT_START_SHARE * start
    loss_flat = last["train_loss"] >= _UNDERFIT_LOSS_FLAT * first["train_loss"]
    metric_first, metric_last = first["metrics"][name], last["metrics"][name]
    scale = max(abs(metric_first), abs(metric_last), 1e-12)
    metric_flat = abs(metric_last - metric_first) <= _UNDERFIT_FLAT * scale
    if not (loss_poor and loss_flat and metric_flat):
        return None
    return _Finding(
        "underfitting",
        f"after {len(history)} epochs the training loss is {last['train_loss']:.4g}, "
        f"{last['train_loss'] / start:.0%} of its {start:.4g} at the first steps, and {name} went only "
        f"from {metric_first:.4g} to {metric_last:.4g}",
        "a higher optimizer.lr (try 10x), more epochs (trainer.max_epochs), a larger network, less "
        "regularisation (dropout, optimizer.weight_decay); debug=overfit checks that the model can "
        "learn at all",
    )


def _instability(summary: Summary) -> _Finding | None:
    spikes = {entry.get("epoch"): entry.get("loss_spikes") or 0 for entry in summary.history or []}
    spiky = {epoch: count for epoch, count in spikes.items() if count}
    skipped = int((summary.nonfinite or {}).get("skipped_steps") or 0)
    if not spiky and not skipped:
        return None
    found = []
    if spiky:
        epochs = ", ".join(str(epoch) for epoch in list(spiky)[:5]) + (", ..." if len(spiky) > 5 else "")
        found.append(
            f"{sum(spiky.values())} loss spike(s) (a step more than twice the median of the 20 before it) "
            f"in epoch(s) {epochs}"
        )
    if skipped:
        found.append(f"{skipped} optimizer step(s) skipped for a non-finite loss or gradient")
    return _Finding(
        "instability",
        " and ".join(found),
        "a lower optimizer.lr, gradient clipping (trainer.gradient_clip_val=1.0), a learning-rate warm-up "
        "(scheduler=cosine scheduler.warmup_steps=100), precision=bf16 or fp32 instead of fp16",
    )


def _input_bound(summary: Summary) -> _Finding | None:
    wait = summary.input_wait or {}
    share = wait.get("share")
    if not finite(share) or share < INPUT_BOUND_SHARE or (wait.get("batches") or 0) < MIN_MEASURED_BATCHES:
        return None
    return _Finding(
        "input-bound",
        f"{share:.0%} of the training time went to waiting for the next batch ({wait.get('wait_s')} s "
        f"waiting, {wait.get('step_s')} s in steps, over {wait.get('batches')} batches)",
        "more loader workers (data.num_workers) with persistent_workers and pin_memory, lighter "
        "per-sample transforms or decoding done once ahead of training, larger batches; data that fits "
        "in memory can be served as tensors on the device (litlab.data.TensorBatches)",
    )


def _small_micro_batch(summary: Summary) -> _Finding | None:
    memory = summary.memory or {}
    total = summary.device_memory_mib
    if memory.get("kind") != "cuda" or not finite(total) or total <= 0 or summary.micro_batch_size is None:
        return None  # None: a datamodule that sizes its own batches has no data.batch_size to raise
    peak = max(memory.get("max_allocated_mib_per_rank") or [0.0])
    if peak >= _SMALL_BATCH_MEMORY_SHARE * total:
        return None
    return _Finding(
        "small micro-batch",
        f"the micro-batch of {summary.micro_batch_size} used at most {peak:.0f} MiB of the device's "
        f"{total:.0f} MiB ({peak / total:.0%})",
        "a larger data.batch_size (tune.batch_size=true finds the largest that fits), with fewer "
        "trainer.accumulate_grad_batches for the same effective batch, or a learning rate scaled with it",
    )


_CHECKS = (_overfitting, _underfitting, _instability, _input_bound, _small_micro_batch)
