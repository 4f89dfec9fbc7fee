"""Write a report: report.md (the table), report.csv (every field of the rows) and report.png (the plot)."""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from litlab.errors import one_line
from litlab.report.collect import CODE_KEY, collect_runs
from litlab.report.compare import DEFAULT_BASELINE, DEVICE_KEYS, MICRO_BATCH, Report, build_report, unfinished
from litlab.report.stats import CONFIDENCE, SIGNIFICANCE
from litlab.run.summary import COMPLETED, FAILED, PRUNED, finite

log = logging.getLogger(__name__)


def report_runs(
    paths: Sequence[Path],
    out_dir: Path,
    baseline: str = DEFAULT_BASELINE,
    metric: str | None = None,
    stopped: str | None = None,
) -> Report:
    """Collect, compare and write the runs under ``paths``; ``stopped``: why the sweep stopped early."""
    report = build_report(collect_runs(paths), baseline=baseline, metric=metric)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "report.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        columns = _csv_columns(report)
        writer.writerow(columns.values())
        writer.writerows([_csv_value(row[key]) for key in columns] for row in report.rows)
    plot(report).savefig(out_dir / "report.png", dpi=110)
    (out_dir / "report.md").write_text(_render_markdown(report, paths, stopped))
    stop = f"; the sweep stopped before its end: {stopped}" if stopped else ""
    log.info(f"report of {_headline(report)}: {out_dir / 'report.md'}{stop}")
    return report


# --- the columns ------------------------------------------------------------------------------------


# Row fields behind the figures; every other field of a row is a column of report.csv, in its order.
_NOT_CSV = {"not_tested", "samples_per_second_values", "metric_values", "findings", "curves"}
# report.csv's names of the metric's fields and of the fields named after them (``metric_ci95_low``).
_CSV_NAMES = {
    "metric": "{metric}",
    "metric_delta": "delta_{metric}",
    "test_metric": "{test_metric}",
    "seconds_to_baseline": "seconds_to_baseline_{metric}",
}


def _csv_columns(report: Report) -> dict[str, str]:
    """report.csv's columns, {field: name}; those of the metric only where the runs have one."""
    columns = {}
    for key in report.rows[0]:
        base = max((b for b in _CSV_NAMES if key == b or key.startswith(f"{b}_")), key=len, default=key)
        name = _CSV_NAMES.get(base, base) + key[len(base) :]
        if key not in _NOT_CSV and (report.metric or "{" not in name):
            columns[key] = _format(name, report)
    return columns


def _format(template: str, report: Report) -> str:
    return template.format(metric=report.metric, test_metric=report.test_metric or "test_metric")


def _csv_value(value: Any) -> Any:
    if isinstance(value, dict):
        value = " ".join(f"{k}={v}" for k, v in value.items())
    return ";".join(map(str, value)) if isinstance(value, list) else "" if value is None else value


def _cell(key: str, row: dict[str, Any]) -> str:
    cell = _CELLS[key][1]
    if isinstance(cell, int):
        return _number(row[key], cell)
    return cell(row) if cell else _text(row[key])


# --- report.md ------------------------------------------------------------------------------------


def _render_markdown(report: Report, sources: Sequence[Path], stopped: str | None) -> str:
    """What was compared, the table, its marks, the statistics in words, the runs that did not complete."""
    shared_keys = ", ".join("code version" if key == CODE_KEY else f"`{key}`" for key in report.context_keys)
    lines = [
        "# Sweep report",
        "",
        f"{_headline(report)} from {', '.join(f'`{p}`' for p in sources)}.",
        "",
        *([f"**The sweep stopped before its end**: {stopped}.", ""] if stopped else []),
        *_best_line(report),
        f"Baseline: the first completed configuration with `{report.baseline}` and the same devices x nodes"
        + (f" and the same {shared_keys}" if shared_keys else "")
        + "; speed-up, memory ratio and Δ are against it. The baseline rows say **baseline**.",
        "",
        *_repeats_lines(report),
        *_table(report),
        "",
        f"n: distinct seeds (a seed run again adds a timing, never a seed); ±: the {CONFIDENCE:.0%} "
        f"confidence interval; p: Welch's t-test against the baseline (p < {SIGNIFICANCE:g}: beyond "
        "run-to-run noise); each column in litlab's docs/sweeps.md.",
        "",
        *_mark_lines(report),
        "![throughput, peak memory and learning curves per configuration](report.png)",
        "",
    ]
    sections = {
        "Counted once": [f"- {note}." for note in report.notes],
        "Skipped": [f"- {skipped}." for skipped in report.skipped],
        "Against run-to-run noise": _noise_lines(report),
        "Doctor": [
            f"- {row['run']}: **{entry['symptom']}**: {entry['evidence']}. Cures: {entry['cures']}"
            for row in report.rows
            for entry in row["findings"]
        ],
        "Runs that did not complete": [
            f"- {row['run']} (`{row['run_dir']}`): {_status_word(row)}: {_one_line(row['error'] or '–')}"
            for row in report.unfinished
        ],
    }
    for title, items in sections.items():
        lines += [f"## {title}", "", *items, ""] if items else []
    return "\n".join(lines)


def _mark_lines(report: Report) -> list[str]:
    """What each mark (†, ‡) says, where a row has it."""
    shared = ", ".join(row["run"] for row in report.rows if row["shared_node"])
    apart = ", ".join(row["run"] for row in report.rows if row["timed_apart"] or len(row["timed_by"]) > 1)
    marks = {  # {what it says: the rows with it}
        f"† Shared the node: other jobs or runs trained beside {shared} (the sweep's record: "
        "`sweep.beside`), so their throughput is not a solo timing. For solo timings run the sweep again "
        "with `hydra.launcher.devices=1 resume=never`: a row then takes its solo timings only.": shared,
        f"‡ Timed under other conditions: {apart} were timed by another start of a sweep (or runs of "
        "their own) than their baseline, or combine such timings (report.csv `timed_by`): another load "
        "of the machine may be in the difference, so the speed-up is not tested.": apart,
    }
    return [line for text, runs in marks.items() if runs for line in (text, "")]


def _table(report: Report) -> list[str]:
    """report.md's table; a column no row has a value in is left out."""
    columns = [key for key in _csv_columns(report) if key in _CELLS]
    table = [(_format(_CELLS[key][0], report), [_cell(key, row) for row in report.rows]) for key in columns]
    table = [(header, cells) for header, cells in table if any(cell not in ("", "–") for cell in cells)]
    lines = [
        "| " + " | ".join(header for header, _ in table) + " |",
        "|" + "|".join("---" for _ in table) + "|",
    ]
    rows = zip(*(cells for _, cells in table), strict=True)
    return lines + ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def _headline(report: Report) -> str:
    """ "6 runs (5 completed, 1 pruned, 0 failed) in 2 rows": each status where there is one."""
    counts = {COMPLETED: 0, FAILED: 0}
    for row in report.rows:
        counts[row["status"]] = counts.get(row["status"], 0) + row["n"]
    said = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda c: c[0] == FAILED))
    in_rows = f" in {len(report.rows)} rows" if len(report.rows) != report.run_count else ""
    return f"{report.run_count} runs ({said}){in_rows}"


def _status_word(row: dict[str, Any]) -> str:
    if row["status"] == PRUNED:
        return f"pruned (epoch {_text(row['pruned_epoch'])})"
    return "**failed**" if row["status"] == FAILED else row["status"]


def _status_cell(row: dict[str, Any]) -> str:
    """The status, † and what a run was resumed across ("code 8373778d→c6928336": it trained under each)."""
    status = _status_word(row) + (" †" if row["shared_node"] else "")
    return "; ".join([status, *(f"resumed across {change}" for change in row["resumed_across"])])


def _differs_cell(row: dict[str, Any]) -> str:
    return " ".join(
        f"code differs: {_text(value)}" if key == CODE_KEY else f"{key}={_text(value)}"
        for key, value in row["differs"].items()
    )


def _half_width(row: dict[str, Any], name: str) -> float:
    """Half the width of a figure's confidence interval (a t-interval is symmetric); nan without one."""
    mean, high = row[name], row[f"{name}_ci95_high"]
    return high - mean if finite(mean) and finite(high) else math.nan


def _estimate_cell(row: dict[str, Any], name: str, decimals: int) -> str:
    half_width = _half_width(row, name)
    plus_minus = f" ± {_number(half_width, decimals)}" if finite(half_width) else ""
    return _number(row[name], decimals) + plus_minus


def _timing_cell(row: dict[str, Any], name: str) -> str:
    """Throughput, ‡ where it combines timings taken under other conditions."""
    return _estimate_cell(row, name, 1) + (" ‡" if len(row["timed_by"]) > 1 and finite(row[name]) else "")


def _compared(row: dict[str, Any], name: str, decimals: int, suffix: str = "") -> str:
    """A speed-up or Δ, its Welch's p-value where it was tested; ‡ a speed-up timed apart."""
    p_value = row[f"{name}_p_value"]
    note = f" (p={p_value:.2g})" if finite(p_value) else ""
    apart = " ‡" if name == "speed_up" and row["timed_apart"] and row[name] is not None else ""
    return _number(row[name], decimals, suffix, signed=name == "metric_delta") + note + apart


def _repeats_lines(report: Report) -> list[str]:
    """A line where no completed row has more than one seed: no interval, no test."""
    completed = [row for row in report.rows if row["status"] == COMPLETED]
    if not completed or any(row["n"] > 1 for row in completed):
        return []
    return [
        "n = 1: every configuration ran one seed, so no row has a confidence interval and no difference "
        "can be told from run-to-run noise; repeat them with seeds (e.g. `seed=1,2,3`).",
        "",
    ]


def _noise_lines(report: Report) -> list[str]:
    """In words, per compared row: does its speed-up and its Δ exceed run-to-run noise?"""
    lines = []
    for row in report.rows:
        if row["is_baseline"] or row["baseline"] is None or row["status"] != COMPLETED:
            continue
        said = {
            "speed_up": f"speed-up {_number(row['speed_up'], 2, 'x')}",
            "metric_delta": f"Δ {report.metric} {_number(row['metric_delta'], 4, signed=True)}",
        }
        parts = [_in_words(what, row, name) for name, what in said.items() if row[name] is not None]
        tested = any(row[f"{name}_p_value"] is not None for name in said)
        if parts and (row["n"] > 1 or row["not_tested"] or row["timed_apart"] or tested):
            label = f"{_config_label(row, report, ' ')} ({row['run']}, n = {row['n']})"
            lines.append(f"- {label} against {row['baseline']}: {'; '.join(parts)}.")
    return lines


def _in_words(what: str, row: dict[str, Any], name: str) -> str:
    """Whether the row's ``name`` (speed_up, metric_delta), said as ``what``, exceeds run-to-run noise."""
    p_value = row[f"{name}_p_value"]
    if row["not_tested"]:
        return f"{what} not tested ({row['not_tested']})"
    if name == "speed_up" and row["timed_apart"]:
        return f"{what} not tested (timed under other conditions than its baseline ‡)"
    if p_value is None:
        return f"{what} not tested (needs n ≥ 2 and some spread on both sides)"
    words, sign = ("exceeds", "<") if row[f"{name}_significant"] else ("is within", "≥")
    return f"{what} {words} run-to-run noise (Welch's t-test p = {p_value:.2g} {sign} {SIGNIFICANCE:g})"


def _best_line(report: Report) -> list[str]:
    scored = [row for row in report.rows if row["status"] == COMPLETED and finite(row["metric"])]
    if not scored:
        return []
    lowest_wins = report.metric_mode == "min"
    best = (min if lowest_wins else max)(scored, key=lambda row: row["metric"])
    word = "Lowest" if lowest_wins else "Highest"
    return [f"{word} {report.metric}: {_number(best['metric'], 4)} ({best['run']}).", ""]


def _precision_cell(row: dict[str, Any]) -> str:
    requested, effective = row["precision_requested"], row["precision_effective"]
    name = f"{row['precision']}: " if row["precision"] else ""
    if effective and effective != requested:
        return f"{name}{requested} → **{effective}**"
    return f"{name}{_text(requested)}"


def _memory_cell(row: dict[str, Any]) -> str:
    prefix = {"cuda": "peak ", "cpu_rss": "RSS "}.get(row["memory_kind"], "")
    return prefix + _estimate_cell(row, "peak_memory_mib", 0) if finite(row["peak_memory_mib"]) else "–"


def _number(value: Any, decimals: int, suffix: str = "", signed: bool = False) -> str:
    """A number with ``decimals`` (and ``suffix``); a word (never) as it is; – for none."""
    if isinstance(value, str):
        return value
    if not isinstance(value, (int, float)):
        return "–"
    return f"{value:{'+' if signed else ''}.{decimals}f}{suffix}"


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "–" if value is None else str(value)


def _one_line(text: Any, limit: int = 300) -> str:
    line = one_line(text or "unknown error")
    return line if len(line) <= limit else line[: limit - 1] + "…"


# report.md's columns, in report.csv's order: {field: (header, cell)}; a cell is a function of the row,
# decimals, or None: the field as text.
_CELLS: dict[str, tuple[str, Callable[[dict[str, Any]], str] | int | None]] = {
    "run": ("run", None),
    "status": ("status", _status_cell),
    "differs": ("differs", _differs_cell),
    "n": ("n", None),
    "seeds": ("seed", lambda r: ", ".join(_text(seed) for seed in r["seeds"])),
    "precision_requested": ("precision (requested → ran)", _precision_cell),
    "accumulate_grad_batches": ("accumulation", None),
    "devices": ("devices x nodes", lambda r: f"{_text(r['devices'])} x {_text(r['num_nodes'])}"),
    "micro_batch_size": ("micro-batch", None),
    "effective_batch_size": ("effective batch", None),
    "samples_per_second": ("samples/s", lambda r: _timing_cell(r, "samples_per_second")),
    "tokens_per_second": ("tokens/s", lambda r: _timing_cell(r, "tokens_per_second")),
    "seconds_per_epoch": ("s/epoch", 2),
    "peak_memory_mib": ("peak memory / device (MiB)", _memory_cell),
    "metric": ("{metric}", lambda r: _estimate_cell(r, "metric", 4)),
    "test_metric": ("{test_metric}", 4),
    "speed_up": ("speed-up", lambda r: _compared(r, "speed_up", 2, "x")),
    "memory_ratio": ("memory ratio", lambda r: _number(r["memory_ratio"], 2, "x")),
    "metric_delta": ("Δ {metric}", lambda r: _compared(r, "metric_delta", 4)),
    "seconds_to_baseline": ("s to baseline's {metric}", 1),
    "baseline": ("baseline", lambda r: "**baseline**" if r["is_baseline"] else r["baseline"] or "none"),
    "diagnosis": ("doctor", lambda r: ", ".join(r["diagnosis"])),
    "error": ("error", lambda r: _one_line(r["error"], limit=120) if unfinished(r) else ""),
}


# --- report.png ---------------------------------------------------------------------------------


def plot(report: Report) -> Any:
    """report.png's Figure: throughput and peak memory per configuration, below them the learning curves."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    precisions = list(dict.fromkeys(str(row["precision"]) for row in report.rows))
    colors = {p: _PALETTE[i % len(_PALETTE)] for i, p in enumerate(precisions)}
    figure = Figure(figsize=(max(1.1 * len(report.rows) + 2.5, 11.0), 11.0), layout="constrained")
    bars, curves = figure.subfigures(2, 1, height_ratios=[7.0, 4.0])
    _draw_bars(report, bars, colors)
    _draw_curves(report, curves, colors)
    return figure


_PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
_LINE_STYLES = ["-", "--", ":", "-."]


def _draw_bars(report: Report, figure: Any, colors: dict[str, str]) -> None:
    """Throughput above, peak memory below: a bar per row with its interval, the baseline hatched."""
    rows, positions = report.rows, range(len(report.rows))
    throughput_axis, memory_axis = figure.subplots(2, 1, sharex=True)
    throughput = f"{report.throughput_unit}_per_second"
    color = [colors[str(row["precision"])] for row in rows]
    for axis, name in ((throughput_axis, throughput), (memory_axis, "peak_memory_mib")):
        values = [float(row[name]) if finite(row[name]) else 0.0 for row in rows]
        error = [_half_width(row, name) for row in rows]
        bars = axis.bar(positions, values, color=color, edgecolor="black", yerr=error, capsize=4)
        for bar, row in zip(bars, rows, strict=True):
            bar.set_hatch("//" if row["is_baseline"] else "")
        axis.set_ylabel(_CELLS[name][0])
    for position, row in zip(positions, rows, strict=True):
        top = max([v for v in (row[throughput], row[f"{throughput}_ci95_high"]) if finite(v)], default=0.0)
        style = {"textcoords": "offset points", "ha": "center", "fontsize": 7}
        color = "#c44e52" if unfinished(row) else "black"
        throughput_axis.annotate(_bar_note(row, report), (position, top), (0, 3), color=color, **style)
    throughput_axis.margins(y=0.25)
    labels = [_config_label(row, report) for row in rows]
    # A line per differing setting; tilted only when long lines or many bars would overlap.
    tilt = len(rows) > 6 or max(len(line) for label in labels for line in label.splitlines()) > 14
    memory_axis.set_xticks(list(positions), labels, rotation=35 if tilt else 0, fontsize=8)
    annotated = f"{report.metric} annotated; " if report.metric else ""
    figure.suptitle(
        f"Throughput and peak memory per configuration\n(hatched: the baseline; {annotated}"
        f"error bars: {CONFIDENCE:.0%} confidence interval over seeds or timings)",
        fontsize=10,
    )


def _bar_note(row: dict[str, Any], report: Report) -> str:
    """What a bar's top says: the metric (and n), or how its run ended; † shared, ‡ timed apart."""
    note = "no metric" if report.metric else ""  # none asked for: the bar says how its run ended only
    if finite(row["metric"]):
        note = f"{report.metric}\n{row['metric']:.3f}"
    if row["status"] == PRUNED:
        note = f"pruned\nepoch {_text(row['pruned_epoch'])}"
    elif row["status"] != COMPLETED:
        note = _status_word(row).strip("*").replace(" ", "\n")
    elif row["n"] > 1:
        note += f"\nn={row['n']}"
    marks = ("\n† shared" if row["shared_node"] else "") + ("\n‡ timed apart" if row["timed_apart"] else "")
    return note + marks


def _draw_curves(report: Report, figure: Any, colors: dict[str, str]) -> None:
    """The metric against wall-clock seconds and against samples seen, one line per run."""
    by_time, by_samples = figure.subplots(1, 2, sharey=True)
    if not report.metric:
        by_time.set_title("no metric to plot (optimized_metric is null; --metric names one)", fontsize=9)
        return
    styles: dict[str, int] = {}  # runs of one precision are told apart by the line style
    drawn = [row for row in report.rows if any(row["curves"])]
    for row in drawn:
        precision, label = str(row["precision"]), _config_label(row, report, " ")
        styles[precision] = styles.get(precision, -1) + 1
        line = {"color": colors[precision], "linestyle": _LINE_STYLES[styles[precision] % 4], "marker": "."}
        line["linewidth"] = 1.4 + row["is_baseline"]
        for points in row["curves"]:  # each run of the row, in the row's style; labelled once
            values = [point["value"] for point in points]
            by_time.plot([point["wall_s"] for point in points], values, label=label, **line)
            label = None
            samples = [point["samples"] for point in points]
            if all(finite(n) for n in samples):
                by_samples.plot(samples, values, **line)
    by_time.set_xlabel("wall-clock seconds of training")
    by_samples.set_xlabel("training samples seen (all ranks)")
    by_time.set_ylabel(report.metric)
    for axis in (by_time, by_samples):
        axis.grid(alpha=0.3)
    if drawn:
        by_time.legend(fontsize=7, ncol=2 if len(drawn) > 6 else 1)
    else:
        by_time.set_title("no per-epoch history in these runs' summary.json", fontsize=9)
    figure.suptitle(
        f"{report.metric} per epoch: against time and against samples (thick: the baselines)", fontsize=10
    )


def _config_label(row: dict[str, Any], report: Report, separator: str = "\n") -> str:
    """What sets the row apart: a part per differing setting (one line each in the plot's labels)."""
    parts = {  # a swept key is in ``differs`` or has a column of its own (precision.*: precision's)
        **dict.fromkeys(DEVICE_KEYS, f"{_text(row['devices'])} x {_text(row['num_nodes'])} devices"),
        "precision": str(row["precision"]),
        "trainer.accumulate_grad_batches": f"acc {row['accumulate_grad_batches']}",
        MICRO_BATCH: f"batch {_text(row['micro_batch_size'])}",
        **{
            key: f"{'code' if key == CODE_KEY else key.rsplit('.', 1)[-1]}={_text(value)}"
            for key, value in row["differs"].items()
        },
    }
    said = dict.fromkeys(parts[key] for key in report.swept_keys if key in parts)
    return separator.join(said) or row["run"]
