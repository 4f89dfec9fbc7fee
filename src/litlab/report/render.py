"""Write a report: report.md (the table), report.csv (every column), report.png (the plot)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from litlab.report.compare import _DEVICE_KEYS, Report, _finite

REPORT_FILES = ("report.md", "report.csv", "report.png")


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """report.md, report.csv and report.png in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in REPORT_FILES]
    _write_csv(report, paths[1])
    plot(report).savefig(paths[2], dpi=110)
    paths[0].write_text(render_markdown(report))
    return paths


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
    "tokens_per_second",
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
    "seconds_to_baseline",
    "baseline",
    "is_baseline",
    "differs",
    "diagnosis",
    "error",
    "run_dir",
]


def _write_csv(report: Report, path: Path) -> None:
    # The metric columns carry the metric's name, so a CSV read elsewhere says what it holds.
    names = {"metric": report.metric, "test_metric": report.test_metric or "test_metric"}
    names["metric_delta"] = f"delta_{report.metric}"
    names["seconds_to_baseline"] = f"seconds_to_baseline_{report.metric}"
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
    unit = report.throughput_unit
    headers += ["micro-batch", "effective batch", f"{unit}/s", "s/epoch", "peak memory / device (MiB)"]
    headers += [report.metric] + ([report.test_metric] if report.test_metric else [])
    headers += ["speed-up", "memory ratio", delta, f"s to baseline's {report.metric}", "baseline"]
    has_differs = any(row["differs"] for row in report.rows)
    if has_differs:
        headers.insert(2, "differs")
    diagnosed = [row for row in report.rows if row["diagnosis"]]
    if diagnosed:
        headers.append("doctor")
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
            _number(row[f"{unit}_per_second"], 1),
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
            _seconds_cell(row["seconds_to_baseline"]),
            "**baseline**" if row["is_baseline"] else (row["baseline"] or "none"),
        ]
        if has_differs:
            cells.insert(2, " ".join(f"{k}={_text(v)}" for k, v in row["differs"].items()))
        if diagnosed:
            cells.append(", ".join(row["diagnosis"]))
        if report.failed:
            cells.append(_one_line(row["error"], limit=120) if row["status"] != "completed" else "")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "![throughput, peak memory and learning curves per configuration](report.png)", ""]
    if diagnosed:
        lines += ["## Doctor", "", "What each run's own numbers show (summary.json `diagnosis`):", ""]
        for row in diagnosed:
            for entry in row["findings"]:
                lines.append(
                    f"- {row['run']}: **{entry['symptom']}**: {entry['evidence']}. Cures: {entry['cures']}"
                )
        lines.append("")
    if report.failed:
        lines += ["## Failed runs", ""]
        lines += [f"- {row['run']} (`{row['run_dir']}`): {_one_line(row['error'])}" for row in report.failed]
        lines.append("")
    lines += [
        "## Columns",
        "",
        f"- {unit}/s: steady-state training throughput of all ranks together (warm-up batches and "
        "validation excluded); s/epoch: median training time of an epoch (the first one excluded "
        "when there are more).",
        "- peak memory / device: CUDA max allocated and reserved (the largest over the ranks), or the "
        "peak resident memory (RSS) of each rank's process on CPU, measured from the start of fitting.",
        "- effective batch = micro-batch x devices x nodes x accumulation. With `data.global_batch_size` "
        "it is fixed and the micro-batch is derived; otherwise the micro-batch is fixed and it grows.",
        "- speed-up = samples/s ÷ the baseline's (the same ratio as tokens/s); memory ratio = peak "
        "memory ÷ the baseline's; "
        f"{delta} = {report.metric} − the baseline's.",
        f"- s to baseline's {report.metric}: wall-clock seconds of training (validation included) until "
        f"the run's {report.metric} first reached the baseline's final value, from its per-epoch history; "
        "never: it did not within the run.",
        "",
    ]
    return "\n".join(lines)


def _seconds_cell(value: Any) -> str:
    return value if isinstance(value, str) else _number(value, 1)


def _best_line(report: Report) -> list[str]:
    scored = [row for row in report.rows if _finite(row["metric"])]
    if not scored:
        return []
    lowest_wins = report.metric_mode == "min"  # as the runs' optimized_metric_mode says
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


def _number(value: Any, decimals: int, suffix: str = "", signed: bool = False) -> str:
    if not isinstance(value, (int, float)):
        return "–"
    return f"{value:{'+' if signed else ''}.{decimals}f}{suffix}"


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "–" if value is None else str(value)


def _one_line(text: Any, limit: int = 300) -> str:
    line = " ".join(str(text or "unknown error").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def plot(report: Report) -> Any:
    """report.png, a matplotlib Figure of two figures: throughput (metric annotated) and peak memory
    per configuration, one column per device count; below, the learning curves of every run."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    precisions = list(dict.fromkeys(str(row["precision"]) for row in report.rows))
    colors = {p: _PALETTE[i % len(_PALETTE)] for i, p in enumerate(precisions)}
    width = max(6.0, 1.1 * len(report.rows) + 2.5, 11.0)
    figure = Figure(figsize=(width, 11.0), layout="constrained")
    bars, curves = figure.subfigures(2, 1, height_ratios=[7.0, 4.0])
    _draw_bars(report, bars, colors)
    _draw_curves(report, curves, colors)
    return figure


_PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
_LINE_STYLES = ["-", "--", ":", "-."]


def _draw_bars(report: Report, figure: Any, colors: dict[str, str]) -> None:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in report.rows:
        groups.setdefault(_devices_label(row), []).append(row)
    widths = [len(rows) for rows in groups.values()]
    axes = figure.subplots(2, len(groups), sharey="row", squeeze=False, width_ratios=widths)
    for column, (devices, rows) in enumerate(groups.items()):
        throughput_axis, memory_axis = axes[0][column], axes[1][column]
        positions = range(len(rows))
        bar_colors = [colors[str(row["precision"])] for row in rows]
        hatches = ["//" if row["is_baseline"] else "" for row in rows]
        throughput = [_or_zero(row[f"{report.throughput_unit}_per_second"]) for row in rows]
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
    axes[0][0].set_ylabel(f"{report.throughput_unit}/s (steady state)")
    axes[1][0].set_ylabel("peak memory / device (MiB)")
    figure.suptitle(
        f"Throughput and peak memory per configuration\n(hatched: the baseline; {report.metric} annotated)",
        fontsize=10,
    )


def _draw_curves(report: Report, figure: Any, colors: dict[str, str]) -> None:
    """The metric against wall-clock seconds and against samples seen, one line per run."""
    by_time, by_samples = figure.subplots(1, 2, sharey=True)
    styles: dict[str, int] = {}  # runs of one precision are told apart by the line style
    drawn = 0
    for row in report.rows:
        points = row["curve"]
        if not points:
            continue
        precision = str(row["precision"])
        style = _LINE_STYLES[styles.get(precision, 0) % len(_LINE_STYLES)]
        styles[precision] = styles.get(precision, 0) + 1
        label = " ".join(_config_label(row, report).splitlines())
        if row["devices"] not in (1, None) or len({r["devices"] for r in report.rows}) > 1:
            label += f" ({_devices_label(row)})"
        values = [point["value"] for point in points]
        line = {"color": colors[precision], "linestyle": style, "marker": ".", "linewidth": 1.4}
        if row["is_baseline"]:
            line["linewidth"] = 2.6
        by_time.plot([point["wall_s"] for point in points], values, label=label, **line)
        samples = [point["samples"] for point in points]
        if all(_finite(n) for n in samples):
            by_samples.plot(samples, values, **line)
        drawn += 1
    by_time.set_xlabel("wall-clock seconds of training")
    by_samples.set_xlabel("training samples seen (all ranks)")
    by_time.set_ylabel(report.metric)
    for axis in (by_time, by_samples):
        axis.grid(alpha=0.3)
    if drawn:
        by_time.legend(fontsize=7, ncol=2 if drawn > 6 else 1)
    else:
        note = "no per-epoch history in these runs' summary.json"
        by_time.text(0.5, 0.5, note, ha="center", transform=by_time.transAxes)
    figure.suptitle(
        f"{report.metric} per epoch: against time and against samples (thick: the baselines)", fontsize=10
    )


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
