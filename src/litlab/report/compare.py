"""Compare runs: one row per run, each against its baseline run (speed-up, memory ratio, metric delta).

The baseline of a row is the first completed run that matches ``baseline`` (``key=value ...``) and
has the same devices x nodes and the same value of every other key the runs were swept over.
Ratios are only ever computed between completed runs. ``litlab.report.render`` writes the result;
``litlab.report.callback.SweepReport`` does both at the end of every multirun.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from litlab.report.collect import CompareError, RunResult, collect_runs

log = logging.getLogger(__name__)

DEFAULT_BASELINE = "precision=fp32 trainer.accumulate_grad_batches=1"
REPORT_FILES = ("report.md", "report.csv", "report.png")

# Baseline keys may name a summary.json field; they mean the config key the user sweeps.
_ALIASES = {
    "accumulation": "trainer.accumulate_grad_batches",
    "accumulate_grad_batches": "trainer.accumulate_grad_batches",
    "devices": "trainer.devices",
    "num_nodes": "trainer.num_nodes",
    "micro_batch_size": "data.batch_size",
    "batch_size": "data.batch_size",
    "global_batch_size": "data.global_batch_size",
}
# Config keys whose value a run's summary.json records as it ran (devices "auto" resolved, the
# micro-batch derived from a global batch): looked up there first.
_FROM_SUMMARY = {
    "trainer.accumulate_grad_batches": "accumulate_grad_batches",
    "trainer.devices": "devices",
    "trainer.num_nodes": "num_nodes",
    "data.batch_size": "micro_batch_size",
    "data.global_batch_size": "global_batch_size",
}
_DEVICE_KEYS = {"trainer.devices", "trainer.num_nodes"}
# Keys with a column of their own; other keys that differ between runs go into the "differs" column.
_OWN_COLUMN = {"precision", "trainer.accumulate_grad_batches", "trainer.devices", "trainer.num_nodes"}
# Groups that choose which jobs a multirun has, not how a run trains (their settings are overrides).
_NOT_SETTINGS = {"sweep", "hparams_search"}


@dataclass
class Report:
    rows: list[dict[str, Any]]
    metric: str
    metric_mode: str  # "max": higher is better; "min": lower is better (a loss, a perplexity)
    test_metric: str | None
    baseline: str
    swept_keys: list[str]  # override keys whose value differs between the runs
    context_keys: list[str]  # besides devices x nodes, what a row and its baseline share
    throughput_unit: str = "samples"  # "tokens" when every completed run counted tokens
    sources: list[Path] = field(default_factory=list)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["status"] != "completed"]


def build_report(
    runs: Sequence[RunResult],
    baseline: str = DEFAULT_BASELINE,
    metric: str | None = None,
    metric_mode: str | None = None,
) -> Report:
    """One row per run, each compared with its baseline: the first completed run that matches
    ``baseline`` (``key=value ...``) and has the same devices x nodes and the same value of every
    other key the runs were swept over. Naming ``trainer.devices`` in ``baseline`` compares every
    device count with that one run."""
    if not runs:
        raise CompareError("no runs to compare")
    spec = parse_baseline(baseline)
    optimized, optimized_mode = _default_metric(runs)
    metric = metric or optimized
    # The direction is recorded for the optimized metric; its val/ and test/ twins share it.
    twin = metric.split("/")[-1] == optimized.split("/")[-1]
    mode = metric_mode or (optimized_mode if twin else "max")
    test_metric = "test/" + metric.split("/", 1)[1] if metric.startswith("val/") else None
    swept = _swept_keys(runs)
    context_keys = [k for k in swept if k not in spec and k not in _DEVICE_KEYS]
    compare_devices = not (_DEVICE_KEYS & spec.keys())

    def context(run: RunResult) -> str:
        devices = [run.summary.devices, run.summary.num_nodes] if compare_devices else []
        return json.dumps([*devices, *(_lookup(run, k) for k in context_keys)], default=str)  # lists too

    contexts = [context(run) for run in runs]
    baselines: dict[str, RunResult] = {}
    for run, key in zip(runs, contexts, strict=True):
        if run.completed and all(_same(_lookup(run, k), v) for k, v in spec.items()):
            baselines.setdefault(key, run)
    rows = []
    for run, key in zip(runs, contexts, strict=True):
        # A run alone in its context (every Optuna trial) has nothing to be compared with.
        base = baselines.get(key) if contexts.count(key) > 1 else None
        rows.append(_row(run, base, metric, test_metric, swept, mode))
    counted = [row["tokens_per_second"] for row in rows if row["status"] == "completed"]
    unit = "tokens" if counted and all(tokens is not None for tokens in counted) else "samples"
    return Report(rows, metric, mode, test_metric, baseline, swept, context_keys, unit)


def parse_baseline(text: str) -> dict[str, str]:
    """``"precision=fp32 trainer.accumulate_grad_batches=1"`` -> {key: value}; aliases resolved."""
    spec = {}
    for item in text.replace(",", " ").split():
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise CompareError(f"baseline item '{item}' is not key=value (e.g. {DEFAULT_BASELINE})")
        spec[_ALIASES.get(key, key)] = value
    if not spec:
        raise CompareError(f"the baseline is empty: give key=value pairs, e.g. {DEFAULT_BASELINE}")
    return spec


def _default_metric(runs: Sequence[RunResult]) -> tuple[str, str]:
    """The runs' optimized_metric and its mode ("min" or "max"), from their summaries or configs."""
    for run in runs:
        config = run.config if run.config is not None else OmegaConf.create()
        name = run.summary.optimized_metric or _select(config, "optimized_metric")
        if name:
            mode = run.summary.optimized_metric_mode or _select(config, "optimized_metric_mode")
            return str(name), str(mode or "max")
    return "val/acc", "max"


def _swept_keys(runs: Sequence[RunResult]) -> list[str]:
    """Override keys (in command-line order) whose value differs between the runs."""
    keys: dict[str, None] = {}
    for run in runs:
        for override in run.summary.overrides or []:
            key = override.split("=", 1)[0].lstrip("+~")
            if not key.startswith("hydra") and key not in _NOT_SETTINGS:
                keys[_ALIASES.get(key, key)] = None
    return [k for k in keys if len({json.dumps(_lookup(run, k), default=str) for run in runs}) > 1]


def _lookup(run: RunResult, key: str) -> Any:
    """A run's value of a config key: its group option, what summary.json recorded, or its config."""
    groups = run.summary.groups or {}
    if key in groups:
        return groups[key]
    recorded = getattr(run.summary, _FROM_SUMMARY[key]) if key in _FROM_SUMMARY else None
    if recorded is not None:
        return recorded
    if run.config is not None:
        value = _select(run.config, key)
        if value is not None:
            return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    for override in run.summary.overrides or []:
        name, _, value = override.partition("=")
        if name.lstrip("+~") == key:
            return value
    return None


def _select(config: DictConfig, key: str) -> Any:
    return OmegaConf.select(config, key, default=None, throw_on_resolution_failure=False)


def _same(value: Any, wanted: str) -> bool:
    if str(value) == wanted:
        return True
    try:
        return float(value) == float(wanted)
    except (TypeError, ValueError):
        return False


def _row(
    run: RunResult,
    base: RunResult | None,
    metric: str,
    test_metric: str | None,
    swept: list[str],
    mode: str = "max",
) -> dict[str, Any]:
    summary = run.summary
    precision = summary.precision or {}
    throughput = summary.throughput or {}
    memory = summary.memory or {}
    metrics = summary.metrics or {}
    row: dict[str, Any] = {
        "run": run.label,
        "status": summary.status,
        "precision": (summary.groups or {}).get("precision"),
        "precision_requested": precision.get("requested"),
        "precision_effective": precision.get("effective"),
        "accumulate_grad_batches": summary.accumulate_grad_batches,
        "devices": summary.devices,
        "num_nodes": summary.num_nodes,
        "micro_batch_size": summary.micro_batch_size,
        "effective_batch_size": summary.effective_batch_size,
        "samples_per_second": throughput.get("samples_per_second"),
        "tokens_per_second": throughput.get("tokens_per_second"),
        "seconds_per_epoch": throughput.get("seconds_per_epoch"),
        "memory_kind": memory.get("kind"),
        "peak_memory_mib": memory.get("peak_mib"),
        "max_allocated_mib_per_rank": memory.get("max_allocated_mib_per_rank"),
        "max_reserved_mib_per_rank": memory.get("max_reserved_mib_per_rank"),
        "peak_rss_mib_per_rank": memory.get("peak_rss_mib_per_rank"),
        "metric": metrics.get(metric),
        "test_metric": metrics.get(test_metric) if test_metric else None,
        "differs": {k: _lookup(run, k) for k in swept if k not in _OWN_COLUMN},
        "baseline": None if base is None else base.label,
        "is_baseline": base is run,
        "speed_up": None,
        "memory_ratio": None,
        "metric_delta": None,
        "seconds_to_baseline": None,  # seconds until the metric first reached the baseline's final value
        "diagnosis": [entry.get("symptom") for entry in summary.diagnosis or []],
        "findings": list(summary.diagnosis or []),  # symptom, evidence, cures (litlab.run.doctor)
        "error": summary.error,
        "run_dir": str(run.dir),
        "curve": curve(summary, metric),
    }
    # Ratios only between completed runs: a failed run may have figures, not those of the run it meant to be.
    if base is not None and run.completed and base.completed:
        base_summary = base.summary
        row["speed_up"] = _ratio(
            row["samples_per_second"], (base_summary.throughput or {}).get("samples_per_second")
        )
        same_kind = (base_summary.memory or {}).get("kind") == row["memory_kind"]
        if same_kind:
            row["memory_ratio"] = _ratio(row["peak_memory_mib"], (base_summary.memory or {}).get("peak_mib"))
        base_metric = (base_summary.metrics or {}).get(metric)
        if _finite(row["metric"]) and _finite(base_metric):
            row["metric_delta"] = row["metric"] - base_metric
        if _finite(base_metric) and row["curve"]:
            row["seconds_to_baseline"] = seconds_to_reach(row["curve"], base_metric, mode)
    return row


def curve(summary: Any, metric: str) -> list[dict[str, float]]:
    """The run's ``metric`` per epoch from summary.json's history: wall seconds, samples seen, value."""
    points = []
    for entry in summary.history or []:
        value = (entry.get("metrics") or {}).get(metric)
        if _finite(value) and _finite(entry.get("wall_s")):
            points.append({"wall_s": entry["wall_s"], "samples": entry.get("samples"), "value": value})
    return points


def seconds_to_reach(points: list[dict[str, float]], target: float, mode: str) -> float | str:
    """Wall seconds at the first epoch whose value is at least as good as ``target`` (in ``mode``'s
    direction), or "never"."""
    for point in points:
        if (point["value"] <= target) if mode == "min" else (point["value"] >= target):
            return point["wall_s"]
    return "never"


def _ratio(value: Any, reference: Any) -> float | None:
    return value / reference if _finite(value) and _finite(reference) and reference > 0 else None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def report_runs(
    paths: Sequence[Path],
    out_dir: Path,
    baseline: str = DEFAULT_BASELINE,
    metric: str | None = None,
    metric_mode: str | None = None,
) -> Report:
    """Collect the runs under ``paths``, compare them and write the report into ``out_dir``."""
    from litlab.report.render import write_report

    report = build_report(collect_runs(paths), baseline=baseline, metric=metric, metric_mode=metric_mode)
    report.sources = list(paths)
    write_report(report, out_dir)
    completed = len(report.rows) - len(report.failed)
    log.info(
        "report of %d runs (%d completed, %d failed): %s",
        len(report.rows),
        completed,
        len(report.failed),
        out_dir / "report.md",
    )
    return report
