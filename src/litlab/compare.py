"""``litlab-compare``: one table and one picture from the summary.json files of runs and sweeps.

    litlab-compare logs/train/multiruns/2026-12-01_10-00-00_1a2b3c      # rebuild a sweep's report
    litlab-compare SWEEP_A SWEEP_B RUN_DIR --out comparison/             # runs made at different times
    litlab-compare SWEEP --baseline "precision=bf16 trainer.accumulate_grad_batches=1" --metric test/acc

Writes report.md, report.csv and report.png: one row per run, with speed-up, memory ratio and metric
delta against a baseline run. ``SweepReport``, a Hydra callback (configs/hydra/default.yaml), does
the same at the end of every multirun and makes the multirun exit non-zero when a job failed.
Nothing here imports torch or matplotlib at import time: Hydra instantiates the callback in every run.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import json
import logging
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

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


class CompareError(ValueError):
    """Bad input to litlab-compare; the message is one sentence."""


@dataclass
class RunResult:
    """One run directory: its summary.json (or a stand-in for a job that wrote none) and config."""

    label: str
    dir: Path
    summary: dict[str, Any]
    config: DictConfig | None

    @property
    def completed(self) -> bool:
        return self.summary.get("status") == "completed"


@dataclass
class Report:
    rows: list[dict[str, Any]]
    metric: str
    test_metric: str | None
    baseline: str
    swept_keys: list[str]  # override keys whose value differs between the runs
    context_keys: list[str]  # besides devices x nodes, what a row and its baseline share
    sources: list[Path] = field(default_factory=list)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["status"] != "completed"]


# --- finding runs ----------------------------------------------------------------------------


def collect_runs(paths: Iterable[Path]) -> list[RunResult]:
    """The runs in each path: a run directory (summary.json or .hydra/) or a sweep directory."""
    paths = [Path(p) for p in paths]
    runs: list[RunResult] = []
    for path in paths:
        if not path.is_dir():
            raise CompareError(f"{path} is not a directory")
        if _is_run_dir(path):
            runs.append(load_run(path, label=path.name))
            continue
        jobs = sorted((d for d in path.iterdir() if d.is_dir() and _is_run_dir(d)), key=_job_order)
        if not jobs:
            raise CompareError(
                f"{path} is neither a run directory (summary.json) nor a sweep directory (job folders)"
            )
        prefix = f"{path.name}/" if len(paths) > 1 else "#"
        runs.extend(load_run(job, label=f"{prefix}{job.name}") for job in jobs)
    return runs


def _is_run_dir(path: Path) -> bool:
    return (path / "summary.json").is_file() or (path / ".hydra" / "config.yaml").is_file()


def _job_order(path: Path) -> tuple[int, str]:
    return (int(path.name), "") if path.name.isdigit() else (sys.maxsize, path.name)


def load_run(run_dir: Path, label: str) -> RunResult:
    """A run's summary.json and config; a job that wrote no summary.json is a failed run."""
    config = next(
        (
            OmegaConf.load(p)
            for p in (run_dir / ".hydra" / "config.yaml", run_dir / "config.yaml")
            if p.is_file()
        ),
        None,
    )
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
    else:
        summary = _stand_in_summary(run_dir, config)
    return RunResult(label=label, dir=run_dir, summary=summary, config=config)


def _stand_in_summary(run_dir: Path, config: DictConfig | None) -> dict[str, Any]:
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    hydra = OmegaConf.load(hydra_file).hydra if hydra_file.is_file() else OmegaConf.create()
    overrides_file = run_dir / ".hydra" / "overrides.yaml"

    def select(key: str) -> Any:
        return _select(config, key) if config is not None else None

    return {
        "status": "failed",
        "error": "no summary.json: the job's process was killed, or it is still running",
        "groups": OmegaConf.to_container(hydra.runtime.choices) if "runtime" in hydra else {},
        "overrides": list(OmegaConf.load(overrides_file)) if overrides_file.is_file() else [],
        "precision": {"requested": select("precision.value"), "effective": None},
        "devices": select("trainer.devices"),
        "num_nodes": select("trainer.num_nodes"),
        "micro_batch_size": select("data.batch_size"),
        "accumulate_grad_batches": select("trainer.accumulate_grad_batches"),
        "global_batch_size": select("data.global_batch_size"),
        "metrics": {},
    }


# --- the comparison --------------------------------------------------------------------------


def build_report(
    runs: Sequence[RunResult], baseline: str = DEFAULT_BASELINE, metric: str | None = None
) -> Report:
    """One row per run, each compared with its baseline: the first completed run that matches
    ``baseline`` (``key=value ...``) and has the same devices x nodes and the same value of every
    other key the runs were swept over. Naming ``trainer.devices`` in ``baseline`` compares every
    device count with that one run."""
    if not runs:
        raise CompareError("no runs to compare")
    spec = parse_baseline(baseline)
    metric = metric or _default_metric(runs)
    test_metric = "test/" + metric.split("/", 1)[1] if metric.startswith("val/") else None
    swept = _swept_keys(runs)
    context_keys = [k for k in swept if k not in spec and k not in _DEVICE_KEYS]
    compare_devices = not (_DEVICE_KEYS & spec.keys())

    def context(run: RunResult) -> str:
        devices = [run.summary.get("devices"), run.summary.get("num_nodes")] if compare_devices else []
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
        rows.append(_row(run, base, metric, test_metric, swept))
    return Report(rows, metric, test_metric, baseline, swept, context_keys)


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


def _default_metric(runs: Sequence[RunResult]) -> str:
    for run in runs:
        if run.config is not None and _select(run.config, "optimized_metric"):
            return str(_select(run.config, "optimized_metric"))
    return "val/acc"


def _swept_keys(runs: Sequence[RunResult]) -> list[str]:
    """Override keys (in command-line order) whose value differs between the runs."""
    keys: dict[str, None] = {}
    for run in runs:
        for override in run.summary.get("overrides") or []:
            key = override.split("=", 1)[0].lstrip("+~")
            if not key.startswith("hydra") and key not in _NOT_SETTINGS:
                keys[_ALIASES.get(key, key)] = None
    return [k for k in keys if len({json.dumps(_lookup(run, k), default=str) for run in runs}) > 1]


def _lookup(run: RunResult, key: str) -> Any:
    """A run's value of a config key: its group option, what summary.json recorded, or its config."""
    groups = run.summary.get("groups") or {}
    if key in groups:
        return groups[key]
    if key in _FROM_SUMMARY and run.summary.get(_FROM_SUMMARY[key]) is not None:
        return run.summary[_FROM_SUMMARY[key]]
    if run.config is not None:
        value = _select(run.config, key)
        if value is not None:
            return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    for override in run.summary.get("overrides") or []:
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
    run: RunResult, base: RunResult | None, metric: str, test_metric: str | None, swept: list[str]
) -> dict[str, Any]:
    summary = run.summary
    precision = summary.get("precision") or {}
    throughput = summary.get("throughput") or {}
    memory = summary.get("memory") or {}
    metrics = summary.get("metrics") or {}
    row: dict[str, Any] = {
        "run": run.label,
        "status": summary.get("status", "unknown"),
        "precision": (summary.get("groups") or {}).get("precision"),
        "precision_requested": precision.get("requested"),
        "precision_effective": precision.get("effective"),
        "accumulate_grad_batches": summary.get("accumulate_grad_batches"),
        "devices": summary.get("devices"),
        "num_nodes": summary.get("num_nodes"),
        "micro_batch_size": summary.get("micro_batch_size"),
        "effective_batch_size": summary.get("effective_batch_size"),
        "samples_per_second": throughput.get("samples_per_second"),
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
        "error": summary.get("error"),
        "run_dir": str(run.dir),
    }
    if base is not None and run.completed:
        base_summary = base.summary
        row["speed_up"] = _ratio(
            row["samples_per_second"], (base_summary.get("throughput") or {}).get("samples_per_second")
        )
        same_kind = (base_summary.get("memory") or {}).get("kind") == row["memory_kind"]
        if same_kind:
            row["memory_ratio"] = _ratio(row["peak_memory_mib"], base_summary["memory"].get("peak_mib"))
        base_metric = (base_summary.get("metrics") or {}).get(metric)
        if _finite(row["metric"]) and _finite(base_metric):
            row["metric_delta"] = row["metric"] - base_metric
    return row


def _ratio(value: Any, reference: Any) -> float | None:
    return value / reference if _finite(value) and _finite(reference) and reference > 0 else None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


# --- writing ---------------------------------------------------------------------------------


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """report.md, report.csv and report.png in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in REPORT_FILES]
    _write_csv(report, paths[1])
    _write_plot(report, paths[2])
    paths[0].write_text(render_markdown(report))
    return paths


def report_runs(
    paths: Sequence[Path], out_dir: Path, baseline: str = DEFAULT_BASELINE, metric: str | None = None
) -> Report:
    """Collect the runs under ``paths``, compare them and write the report into ``out_dir``."""
    report = build_report(collect_runs(paths), baseline=baseline, metric=metric)
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


_CSV_COLUMNS = [
    "run",
    "status",
    "precision",
    "precision_requested",
    "precision_effective",
    "accumulate_grad_batches",
    "devices",
    "num_nodes",
    "micro_batch_size",
    "effective_batch_size",
    "samples_per_second",
    "seconds_per_epoch",
    "memory_kind",
    "peak_memory_mib",
    "max_allocated_mib_per_rank",
    "max_reserved_mib_per_rank",
    "peak_rss_mib_per_rank",
    "metric",
    "test_metric",
    "speed_up",
    "memory_ratio",
    "metric_delta",
    "baseline",
    "is_baseline",
    "differs",
    "error",
    "run_dir",
]


def _write_csv(report: Report, path: Path) -> None:
    # The metric columns carry the metric's name, so a CSV read elsewhere says what it holds.
    names = {"metric": report.metric, "test_metric": report.test_metric or "test_metric"}
    names["metric_delta"] = f"delta_{report.metric}"
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow([names.get(c, c) for c in _CSV_COLUMNS])
        for row in report.rows:
            writer.writerow([_csv_value(row[c]) for c in _CSV_COLUMNS])


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return value


def render_markdown(report: Report) -> str:
    """The report as Markdown: what was compared, the table, the failures, what the columns mean."""
    delta = f"Δ {report.metric}"
    headers = ["run", "status", "precision (requested → ran)", "accumulation", "devices x nodes"]
    headers += ["micro-batch", "effective batch", "samples/s", "s/epoch", "peak memory / device (MiB)"]
    headers += [report.metric] + ([report.test_metric] if report.test_metric else [])
    headers += ["speed-up", "memory ratio", delta, "baseline"]
    has_differs = any(row["differs"] for row in report.rows)
    if has_differs:
        headers.insert(2, "differs")
    if report.failed:
        headers.append("error")
    lines = [
        "# Sweep report",
        "",
        f"{len(report.rows)} runs ({len(report.rows) - len(report.failed)} completed, "
        f"{len(report.failed)} failed) from " + ", ".join(f"`{p}`" for p in report.sources) + ".",
        "",
        *_best_line(report),
        f"Baseline: the first completed run with `{report.baseline}` and the same devices x nodes"
        + (f" and the same {', '.join(f'`{k}`' for k in report.context_keys)}" if report.context_keys else "")
        + "; speed-up, memory ratio and Δ are against it. The baseline rows say **baseline**.",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    for row in report.rows:
        cells = [
            row["run"],
            "**failed**" if row["status"] != "completed" else row["status"],
            _precision_cell(row),
            _text(row["accumulate_grad_batches"]),
            f"{_text(row['devices'])} x {_text(row['num_nodes'])}",
            _text(row["micro_batch_size"]),
            _text(row["effective_batch_size"]),
            _number(row["samples_per_second"], 1),
            _number(row["seconds_per_epoch"], 2),
            _memory_cell(row),
            _number(row["metric"], 4),
        ]
        if report.test_metric:
            cells.append(_number(row["test_metric"], 4))
        cells += [
            _number(row["speed_up"], 2, "x"),
            _number(row["memory_ratio"], 2, "x"),
            _number(row["metric_delta"], 4, signed=True),
            "**baseline**" if row["is_baseline"] else (row["baseline"] or "none"),
        ]
        if has_differs:
            cells.insert(2, " ".join(f"{k}={_text(v)}" for k, v in row["differs"].items()))
        if report.failed:
            cells.append(_one_line(row["error"], limit=120) if row["status"] != "completed" else "")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "![throughput and peak memory per configuration](report.png)", ""]
    if report.failed:
        lines += ["## Failed runs", ""]
        lines += [f"- {row['run']} (`{row['run_dir']}`): {_one_line(row['error'])}" for row in report.failed]
        lines.append("")
    lines += [
        "## Columns",
        "",
        "- samples/s: steady-state training throughput of all ranks together (warm-up batches and "
        "validation excluded); s/epoch: median training time of an epoch (the first one excluded "
        "when there are more).",
        "- peak memory / device: CUDA max allocated and reserved (the largest over the ranks), or the "
        "peak resident memory (RSS) of each rank's process on CPU, measured from the start of fitting.",
        "- effective batch = micro-batch x devices x nodes x accumulation. With `data.global_batch_size` "
        "it is fixed and the micro-batch is derived; otherwise the micro-batch is fixed and it grows.",
        f"- speed-up = samples/s ÷ the baseline's; memory ratio = peak memory ÷ the baseline's; "
        f"{delta} = {report.metric} − the baseline's.",
        "",
    ]
    return "\n".join(lines)


def _best_line(report: Report) -> list[str]:
    scored = [row for row in report.rows if _finite(row["metric"])]
    if not scored:
        return []
    lowest_wins = "loss" in report.metric  # accuracies and scores: the highest
    best = (min if lowest_wins else max)(scored, key=lambda row: row["metric"])
    word = "Lowest" if lowest_wins else "Highest"
    return [f"{word} {report.metric}: {best['metric']:.4f} ({best['run']}).", ""]


def _precision_cell(row: dict[str, Any]) -> str:
    requested, effective = row["precision_requested"], row["precision_effective"]
    name = f"{row['precision']}: " if row["precision"] else ""
    if effective and effective != requested:
        return f"{name}{requested} → **{effective}**"
    return f"{name}{_text(requested)}"


def _memory_cell(row: dict[str, Any]) -> str:
    if row["memory_kind"] == "cuda":
        allocated = max(row["max_allocated_mib_per_rank"] or [0])
        reserved = max(row["max_reserved_mib_per_rank"] or [0])
        return f"{allocated:.0f} allocated, {reserved:.0f} reserved"
    if row["memory_kind"] == "cpu_rss":
        return "RSS " + ", ".join(f"{v:.0f}" for v in row["peak_rss_mib_per_rank"] or [])
    return "–"


def _number(value: Any, digits: int, suffix: str = "", signed: bool = False) -> str:
    if not isinstance(value, (int, float)):
        return "–"
    return f"{value:{'+' if signed else ''}.{digits}f}{suffix}"


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "–" if value is None else str(value)


def _one_line(text: Any, limit: int = 300) -> str:
    line = " ".join(str(text or "unknown error").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _write_plot(report: Report, path: Path) -> None:
    """Throughput (metric annotated) and peak memory per configuration, one column per device count."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    groups: dict[str, list[dict[str, Any]]] = {}
    for row in report.rows:
        groups.setdefault(_devices_label(row), []).append(row)
    precisions = list(dict.fromkeys(str(row["precision"]) for row in report.rows))
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    colors = {p: palette[i % len(palette)] for i, p in enumerate(precisions)}
    widths = [len(rows) for rows in groups.values()]
    figure = Figure(figsize=(max(6.0, 1.1 * sum(widths) + 2.5), 7.0), layout="constrained")
    axes = figure.subplots(2, len(groups), sharey="row", squeeze=False, width_ratios=widths)
    for column, (devices, rows) in enumerate(groups.items()):
        throughput_axis, memory_axis = axes[0][column], axes[1][column]
        positions = range(len(rows))
        bar_colors = [colors[str(row["precision"])] for row in rows]
        hatches = ["//" if row["is_baseline"] else "" for row in rows]
        throughput = [_or_zero(row["samples_per_second"]) for row in rows]
        memory = [_or_zero(row["peak_memory_mib"]) for row in rows]
        for axis, values in ((throughput_axis, throughput), (memory_axis, memory)):
            bars = axis.bar(positions, values, color=bar_colors, edgecolor="black", linewidth=0.6)
            for bar, hatch in zip(bars, hatches, strict=True):
                bar.set_hatch(hatch)
        for position, row, value in zip(positions, rows, throughput, strict=True):
            note = f"{report.metric}\n{row['metric']:.3f}" if _finite(row["metric"]) else "no metric"
            failed = row["status"] != "completed"
            throughput_axis.annotate(
                "failed" if failed else note,
                (position, value),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="#c44e52" if failed else "black",
            )
        throughput_axis.set_title(devices)
        throughput_axis.margins(y=0.25)
        labels = [_config_label(row, report) for row in rows]
        memory_axis.set_xticks(list(positions), labels)
        # A line per differing setting; tilted only when long lines or many bars would overlap.
        longest = max(len(line) for label in labels for line in label.splitlines())
        tilt = len(rows) > 6 or longest > 14
        memory_axis.tick_params(axis="x", labelrotation=35 if tilt else 0, labelsize=8)
        throughput_axis.tick_params(axis="x", labelbottom=False)
    axes[0][0].set_ylabel("samples/s (steady state)")
    axes[1][0].set_ylabel("peak memory / device (MiB)")
    figure.suptitle(
        f"Throughput and peak memory per configuration\n(hatched: the baseline; {report.metric} annotated)",
        fontsize=10,
    )
    figure.savefig(path, dpi=110)


def _devices_label(row: dict[str, Any]) -> str:
    devices, nodes = _text(row["devices"]), row["num_nodes"]
    label = f"{devices} device" + ("" if devices == "1" else "s")
    return label if nodes in (1, None) else f"{label} x {nodes} nodes"


def _config_label(row: dict[str, Any], report: Report) -> str:
    parts = []
    for key in report.swept_keys:
        if key in _DEVICE_KEYS:
            continue
        if key == "precision":
            parts.append(str(row["precision"]))
        elif key == "trainer.accumulate_grad_batches":
            parts.append(f"acc {row['accumulate_grad_batches']}")
        else:
            parts.append(f"{key.rsplit('.', 1)[-1]}={_text(row['differs'].get(key))}")
    return "\n".join(parts) or row["run"]


def _or_zero(value: Any) -> float:
    return float(value) if _finite(value) else 0.0


# --- entry points ----------------------------------------------------------------------------


class SweepReport(Callback):
    """Hydra callback (``hydra.callbacks``): writes the report into the sweep directory when a
    multirun ends, then exits non-zero if any job failed, so scripts notice."""

    def __init__(
        self, baseline: str = DEFAULT_BASELINE, metric: str | None = None, tasks: Sequence[str] = ("train",)
    ) -> None:
        self.baseline = baseline
        self.metric = metric
        self.tasks = list(tasks)  # task_names whose jobs write summary.json (litlab-eval's do not)
        self._written = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.task_name not in self.tasks:
            return
        # When the sweeper itself gives up (Optuna with every trial failed, a joblib worker killed
        # by the system), Hydra never calls on_multirun_end: report what ran when the process exits.
        atexit.register(self._report_if_not_written, Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.task_name not in self.tasks:
            return
        report = self._report(Path(config.hydra.sweep.dir))
        if report is None or report.failed:
            if report is not None:
                log.error("%d of %d jobs failed (see report.md)", len(report.failed), len(report.rows))
            # Hydra turns an exception raised by a callback into a warning; SystemExit gets through.
            raise SystemExit(1)

    def _report(self, sweep_dir: Path) -> Report | None:
        self._written = True
        try:
            return report_runs([sweep_dir], sweep_dir, baseline=self.baseline, metric=self.metric)
        except Exception:
            log.exception("could not write the report of %s", sweep_dir)
            return None

    def _report_if_not_written(self, sweep_dir: Path) -> None:
        if not self._written and sweep_dir.is_dir():
            self._report(sweep_dir)


def main(argv: Sequence[str] | None = None) -> None:
    """Console script ``litlab-compare``."""
    parser = argparse.ArgumentParser(
        prog="litlab-compare",
        description="Compare runs: report.md, report.csv and report.png from their summary.json files.",
    )
    parser.add_argument("paths", nargs="+", type=Path, help="sweep directories and/or run directories")
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        help=f"key=value pairs the baseline run has (default: '{DEFAULT_BASELINE}'); keys are config "
        "groups or dotted config keys; name trainer.devices to compare every device count with one run",
    )
    parser.add_argument(
        "--metric", default=None, help="metric to report (default: the runs' optimized_metric)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the report (default: the one directory given)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.out is None and len(args.paths) > 1:
        parser.exit(
            2, "litlab-compare: error: several directories given: name the output folder with --out\n"
        )
    try:
        report_runs(args.paths, args.out or args.paths[0], baseline=args.baseline, metric=args.metric)
    except CompareError as error:
        parser.exit(2, f"litlab-compare: error: {error}\n")


if __name__ == "__main__":
    main()
