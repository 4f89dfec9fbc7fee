"""Write a report: report.md (the table), report.csv (every column), report.png (the plot);
``report_runs`` collects, compares and writes in one call."""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from litlab.errors import one_line
from litlab.report.collect import collect_runs
from litlab.report.compare import (
    _DEVICE_KEYS,
    _MICRO_BATCH,
    CODE_KEY,
    DEFAULT_BASELINE,
    ROW_INTERNALS,
    Report,
    build_report,
    unfinished,
)
from litlab.report.stats import CONFIDENCE, SIGNIFICANCE
from litlab.run.summary import COMPLETED, FAILED, INTERRUPTED, PRUNED, RUNNING_ELSEWHERE, finite

log = logging.getLogger(__name__)


def report_runs(
    paths: Sequence[Path], out_dir: Path, baseline: str = DEFAULT_BASELINE, metric: str | None = None
) -> Report:
    """Collect the runs under ``paths``, compare them and write report.csv, report.png and report.md
    into ``out_dir``."""
    report = build_report(collect_runs(paths), baseline=baseline, metric=metric)
    report.sources = list(paths)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_csv(report, out_dir / "report.csv")
    plot(report).savefig(out_dir / "report.png", dpi=110)
    (out_dir / "report.md").write_text(render_markdown(report))
    log.info(
        "report of %d runs (%s) in %d rows: %s",
        report.run_count,
        _counts(report),
        len(report.rows),
        out_dir / "report.md",
    )
    return report


def _write_csv(report: Report, path: Path) -> None:
    # The metric columns carry the metric's name, so a CSV read elsewhere says what it holds.
    names = {"metric": report.metric, "test_metric": report.test_metric or "test_metric"}
    names["metric_ci95_low"] = f"{report.metric}_ci95_low"
    names["metric_ci95_high"] = f"{report.metric}_ci95_high"
    names["metric_delta"] = f"delta_{report.metric}"
    names["metric_delta_p_value"] = f"delta_{report.metric}_p_value"
    names["metric_delta_significant"] = f"delta_{report.metric}_significant"
    names["seconds_to_baseline"] = f"seconds_to_baseline_{report.metric}"
    columns = [name for name in report.rows[0] if name not in ROW_INTERNALS]
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow([names.get(c, c) for c in columns])
        for row in report.rows:
            writer.writerow([_csv_value(row[c]) for c in columns])


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return value


def render_markdown(report: Report) -> str:
    """The report as Markdown: what was compared, the table, the statistics in words, the failures,
    what the columns mean."""
    delta = f"Δ {report.metric}"
    unit = report.throughput_unit
    columns: list[tuple[str | None, Callable[[dict[str, Any]], str]]] = [
        ("run", lambda row: row["run"]),
        ("status", _status_cell),
        ("differs", _differs_cell),
        ("n", lambda row: str(row["n"])),
        (report.repeat_key or "seed", lambda row: ", ".join(_text(seed) for seed in row["seeds"])),
        ("precision (requested → ran)", _precision_cell),
        ("accumulation", lambda row: _text(row["accumulate_grad_batches"])),
        ("devices x nodes", lambda row: f"{_text(row['devices'])} x {_text(row['num_nodes'])}"),
        ("micro-batch", lambda row: _text(row["micro_batch_size"])),
        ("effective batch", lambda row: _text(row["effective_batch_size"])),
        (f"{unit}/s", lambda row: _estimate_cell(row, f"{unit}_per_second", 1)),
        ("s/epoch", lambda row: _number(row["seconds_per_epoch"], 2)),
        ("peak memory / device (MiB)", _memory_cell),
        (report.metric, lambda row: _estimate_cell(row, "metric", 4)),
        (report.test_metric, lambda row: _number(row["test_metric"], 4)),
        ("speed-up", lambda row: _compared_cell(row, "speed_up", 2, "x")),
        ("memory ratio", lambda row: _number(row["memory_ratio"], 2, "x")),
        (delta, lambda row: _compared_cell(row, "metric_delta", 4, signed=True)),
        (f"s to baseline's {report.metric}", lambda row: _number(row["seconds_to_baseline"], 1)),
        ("baseline", lambda row: "**baseline**" if row["is_baseline"] else (row["baseline"] or "none")),
        ("doctor", lambda row: ", ".join(row["diagnosis"])),
        ("error", lambda row: _one_line(row["error"], limit=120) if unfinished(row) else ""),
    ]
    # Columns other than differs, seed, doctor and error have a word or a dash in every cell: those
    # four are left out where no row has one.
    table = [(header, [cell(row) for row in report.rows]) for header, cell in columns if header]
    table = [(header, cells) for header, cells in table if any(cells)]
    shared = [row for row in report.rows if row["shared_node"]]
    in_rows = f" in {len(report.rows)} rows" if len(report.rows) != report.run_count else ""
    shared_keys = ", ".join("code version" if key == CODE_KEY else f"`{key}`" for key in report.context_keys)
    lines = [
        "# Sweep report",
        "",
        f"{report.run_count} runs ({_counts(report)}){in_rows} "
        "from " + ", ".join(f"`{p}`" for p in report.sources) + ".",
        "",
        *_best_line(report),
        f"Baseline: the first completed configuration with `{report.baseline}` and the same devices x nodes"
        + (f" and the same {shared_keys}" if shared_keys else "")
        + "; speed-up, memory ratio and Δ are against it. The baseline rows say **baseline**.",
        "",
        *_repeats_lines(report),
        "| " + " | ".join(header for header, _ in table) + " |",
        "|" + "|".join("---" for _ in table) + "|",
        *(
            "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |"
            for row in zip(*(c for _, c in table), strict=True)
        ),
        "",
    ]
    if shared:
        lines += [
            f"† Shared the node: other jobs of the sweep ran beside {_names(shared)} (the sweep's "
            "record, `.jobs/<job>.json`: `sweep.beside`), so their throughput is not a solo timing. "
            "`hydra.launcher.devices=1` gives solo timings only to runs it trains: run the sweep again with "
            "`hydra.launcher.devices=1 resume=never` (without resume=never every job finds its run "
            "completed and skips it; this report stays as it is, built from the sweep's record).",
            "",
        ]
    lines += _section("Counted once", [f"- {note}." for note in report.notes])
    skipped = [f"- {skipped}." for skipped in report.skipped]
    lines += _section("Skipped", skipped, "Jobs that found their run completed; their rows show that run:")
    lines += ["![throughput, peak memory and learning curves per configuration](report.png)", ""]
    lines += _section("Against run-to-run noise", _noise_lines(report))
    findings = [
        f"- {row['run']}: **{entry['symptom']}**: {entry['evidence']}. Cures: {entry['cures']}"
        for row in report.rows
        for entry in row["findings"]
    ]
    lines += _section("Doctor", findings, "What each run's own numbers show (summary.json `diagnosis`):")
    pruned = [
        f"- {row['run']} (`{row['run_dir']}`): stopped by the Optuna pruner after the validation of "
        f"epoch {_text(row['pruned_epoch'])}; not a failure."
        for row in report.pruned
    ]
    lines += _section("Pruned trials", pruned)
    unfinished_rows = [
        f"- {row['run']} (`{row['run_dir']}`): {_status_word(row)}: {_one_line(row['error'])}"
        for row in report.unfinished
    ]
    lines += _section("Runs that did not complete", unfinished_rows)
    level = f"{CONFIDENCE:.0%}"
    lines += [
        "## Columns",
        "",
        "- n: the runs in the row: completed runs that differ only in their seed are one configuration. "
        f"With n ≥ 2 a figure is their mean ± the half-width of its {level} confidence interval "
        "(Student's t); report.csv has the interval's ends (`_ci95_low`, `_ci95_high`).",
        f"- {unit}/s: steady-state training throughput of all ranks together (warm-up batches and "
        "validation excluded); s/epoch: median training time of an epoch (the first one excluded "
        "when there are more).",
        "- peak memory / device: CUDA max allocated and reserved (the largest over the ranks), or the "
        "peak resident memory (RSS) of each rank's process on CPU, measured from the start of fitting.",
        "- effective batch = micro-batch x devices x nodes x accumulation. With `global_batch_size` "
        "it is fixed and the micro-batch is derived; otherwise the micro-batch is fixed and it grows.",
        "- speed-up = samples/s ÷ the baseline's (the same ratio as tokens/s); memory ratio = peak "
        "memory ÷ the baseline's; "
        f"{delta} = {report.metric} − the baseline's (means, when rows have several runs).",
        f"- p: Welch's t-test of the row's runs against the baseline's; p < {SIGNIFICANCE:g} means the "
        "difference exceeds run-to-run noise. Only rows and baselines of n ≥ 2 are tested, and "
        "none with a run resumed across a change of code or settings (it trained partly under each).",
        f"- s to baseline's {report.metric}: wall-clock seconds of training (validation included) until "
        f"the run's {report.metric} first reached the baseline's final value, from its per-epoch history; "
        "never: it did not within the run.",
        "",
    ]
    return "\n".join(lines)


def _section(title: str, items: list[str], intro: str | None = None) -> list[str]:
    """A "## title" section of ``items`` (none where there are none), after one line of ``intro``."""
    if not items:
        return []
    return [f"## {title}", "", *([intro, ""] if intro else []), *items, ""]


def _counts(report: Report) -> str:
    """The runs of each status, as in "6 completed, 1 pruned, 0 failed" (pruned, interrupted and
    running elsewhere only where there are any)."""
    counts = {status: 0 for status in (COMPLETED, PRUNED, INTERRUPTED, RUNNING_ELSEWHERE, FAILED)}
    for row in report.rows:
        counts[row["status"]] = counts.get(row["status"], 0) + row["n"]
    return ", ".join(f"{n} {status}" for status, n in counts.items() if n or status in (COMPLETED, FAILED))


def _status_word(row: dict[str, Any]) -> str:
    if row["status"] == PRUNED:
        return f"pruned (epoch {_text(row['pruned_epoch'])})"
    if row["status"] in (COMPLETED, INTERRUPTED, RUNNING_ELSEWHERE):
        return row["status"]
    return "**failed**"


def _status_cell(row: dict[str, Any]) -> str:
    status = _status_word(row) + (" †" if row["shared_node"] else "")
    return "; ".join([status, *(_trained_under(change) for change in row["resumed_across"])])


def _trained_under(change: str) -> str:
    """What a run resumed across ``change`` trained under, e.g. from "code 8373778d→c6928336":
    "trained under two code versions: 8373778d→c6928336"."""
    kind, _, versions = change.partition(" ")
    count = versions.count("→") + 1
    what = {"code": "code versions"}.get(kind, kind)
    return f"trained under {_COUNTS.get(count, str(count))} {what}: {versions}"


_COUNTS = {2: "two", 3: "three", 4: "four"}


def _differs_cell(row: dict[str, Any]) -> str:
    return " ".join(
        f"code differs: {_text(value)}" if key == CODE_KEY else f"{key}={_text(value)}"
        for key, value in row["differs"].items()
    )


def _estimate_cell(row: dict[str, Any], name: str, decimals: int) -> str:
    """The mean and the half-width of its confidence interval (a t-interval is symmetric)."""
    mean, high = row[name], row[f"{name}_ci95_high"]
    half_width = f" ± {_number(high - mean, decimals)}" if finite(mean) and finite(high) else ""
    return _number(mean, decimals) + half_width


def _compared_cell(
    row: dict[str, Any], name: str, decimals: int, suffix: str = "", signed: bool = False
) -> str:
    """A row's speed-up or Δ against its baseline, and Welch's p-value where it was tested."""
    p_value = row[f"{name}_p_value"]
    note = f" (p={_p_text(p_value)})" if finite(p_value) else ""
    return _number(row[name], decimals, suffix, signed) + note


def _p_text(p_value: float) -> str:
    return f"{p_value:.2g}"


def _names(rows: list[dict[str, Any]]) -> str:
    return ", ".join(row["run"] for row in rows)


def _repeats_lines(report: Report) -> list[str]:
    """One line on the rows of one run, which have no interval and no test; or one on the repeats."""
    completed = [row for row in report.rows if row["status"] == COMPLETED]
    single = [row for row in completed if row["n"] == 1]
    if not completed:
        return []
    if len(single) == len(completed):
        return [
            "n = 1: every configuration ran once, so no row has a confidence interval and no difference "
            "can be told from run-to-run noise; repeat them with seeds (e.g. `seed=1,2,3`).",
            "",
        ]
    grouped = "runs that differ only in `seed`" if report.repeat_key else "runs of the same settings"
    line = (
        f"Repeats: {grouped} are one row, with n runs: mean ± the {CONFIDENCE:.0%} confidence interval, "
        f"and Welch's t-test at {SIGNIFICANCE:.0%} against the baseline."
    )
    if single:
        line += f" Rows with n = 1 ({_names(single)}) have no interval and no test."
    return [line, ""]


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
        if parts and (row["n"] > 1 or row["not_tested"] or tested):
            label = _config_label(row, report, " ")
            lines.append(
                f"- {label} ({row['run']}, n = {row['n']}) against {row['baseline']}: {'; '.join(parts)}."
            )
    return lines


def _in_words(what: str, row: dict[str, Any], name: str) -> str:
    """Whether the row's ``name`` (speed_up, metric_delta), said as ``what``, exceeds run-to-run noise."""
    p_value = row[f"{name}_p_value"]
    if row["not_tested"]:
        return f"{what} not tested ({row['not_tested']})"
    if p_value is None:
        return f"{what} not tested (needs n ≥ 2 and some spread on both sides)"
    words, sign = ("exceeds", "<") if row[f"{name}_significant"] else ("is within", "≥")
    return f"{what} {words} run-to-run noise (Welch's t-test p = {_p_text(p_value)} {sign} {SIGNIFICANCE:g})"


def _best_line(report: Report) -> list[str]:
    scored = [row for row in report.rows if row["status"] == COMPLETED and finite(row["metric"])]
    if not scored:
        return []
    lowest_wins = report.metric_mode == "min"  # as the runs' optimized_metric_mode says
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
    if row["n"] > 1:  # several runs: the mean peak (largest rank) and its interval
        prefix = {"cuda": "peak ", "cpu_rss": "RSS "}.get(row["memory_kind"], "")
        return prefix + _estimate_cell(row, "peak_memory_mib", 0) if finite(row["peak_memory_mib"]) else "–"
    if row["memory_kind"] == "cuda":
        allocated = max(row["max_allocated_mib_per_rank"] or [0])
        reserved = max(row["max_reserved_mib_per_rank"] or [0])
        return f"{allocated:.0f} allocated, {reserved:.0f} reserved"
    if row["memory_kind"] == "cpu_rss":
        return "RSS " + ", ".join(f"{v:.0f}" for v in row["peak_rss_mib_per_rank"] or [])
    return "–"


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


def plot(report: Report) -> Any:
    """report.png, a matplotlib Figure of two figures: throughput (metric annotated) and peak memory
    per configuration, one column per device count; below, the learning curves of every run."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    precisions = list(dict.fromkeys(str(row["precision"]) for row in report.rows))
    colors = {p: _PALETTE[i % len(_PALETTE)] for i, p in enumerate(precisions)}
    width = max(1.1 * len(report.rows) + 2.5, 11.0)
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
        throughput_name = f"{report.throughput_unit}_per_second"
        throughput = [_or_zero(row[throughput_name]) for row in rows]
        memory = [_or_zero(row["peak_memory_mib"]) for row in rows]
        for axis, values, name in (
            (throughput_axis, throughput, throughput_name),
            (memory_axis, memory, "peak_memory_mib"),
        ):
            bars = axis.bar(
                positions,
                values,
                color=bar_colors,
                edgecolor="black",
                linewidth=0.6,
                yerr=_error_bars(rows, name),
                capsize=4,
                error_kw={"elinewidth": 1.0},
            )
            for bar, hatch in zip(bars, hatches, strict=True):
                bar.set_hatch(hatch)
        for position, row, value in zip(positions, rows, throughput, strict=True):
            top = row[f"{throughput_name}_ci95_high"]
            value = max(value, top) if finite(top) else value  # the note above the error bar
            note = f"{report.metric}\n{row['metric']:.3f}" if finite(row["metric"]) else "no metric"
            if row["status"] == PRUNED:
                note = f"pruned\nepoch {_text(row['pruned_epoch'])}"
            elif row["status"] in (INTERRUPTED, RUNNING_ELSEWHERE):
                note = row["status"].replace(" ", "\n")
            elif row["status"] != COMPLETED:
                note = "failed"
            elif row["n"] > 1:
                note += f"\nn={row['n']}"
            if row["shared_node"]:
                note += "\n† shared"
            throughput_axis.annotate(
                note,
                (position, value),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="#c44e52" if unfinished(row) else "black",
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
        f"Throughput and peak memory per configuration\n(hatched: the baseline; {report.metric} annotated; "
        f"error bars: {CONFIDENCE:.0%} confidence interval of n runs)",
        fontsize=10,
    )


def _draw_curves(report: Report, figure: Any, colors: dict[str, str]) -> None:
    """The metric against wall-clock seconds and against samples seen, one line per run."""
    by_time, by_samples = figure.subplots(1, 2, sharey=True)
    styles: dict[str, int] = {}  # runs of one precision are told apart by the line style
    drawn = 0
    for row in report.rows:
        if not any(row["curves"]):
            continue
        precision = str(row["precision"])
        style = _LINE_STYLES[styles.get(precision, 0) % len(_LINE_STYLES)]
        styles[precision] = styles.get(precision, 0) + 1
        label = _config_label(row, report, " ")
        if row["devices"] not in (1, None) or len({r["devices"] for r in report.rows}) > 1:
            label += f" ({_devices_label(row)})"
        line = {"color": colors[precision], "linestyle": style, "marker": ".", "linewidth": 1.4}
        if row["is_baseline"]:
            line["linewidth"] = 2.6
        for points in row["curves"]:  # each run of the row, in the row's style; labelled once
            values = [point["value"] for point in points]
            by_time.plot([point["wall_s"] for point in points], values, label=label, **line)
            label = None
            samples = [point["samples"] for point in points]
            if all(finite(n) for n in samples):
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


def _config_label(row: dict[str, Any], report: Report, separator: str = "\n") -> str:
    """What sets the row apart: a part per differing setting (one line each in the plot's labels)."""
    parts = []
    for key in report.swept_keys:
        if key in _DEVICE_KEYS or key.startswith("precision."):
            continue
        if key == "precision":
            parts.append(str(row["precision"]))
        elif key == "trainer.accumulate_grad_batches":
            parts.append(f"acc {row['accumulate_grad_batches']}")
        elif key == CODE_KEY:
            parts.append(f"code {_text(row['differs'].get(key))}")
        elif key == _MICRO_BATCH and key not in row["differs"]:
            parts.append(f"batch {_text(row['micro_batch_size'])}")
        else:
            parts.append(f"{key.rsplit('.', 1)[-1]}={_text(row['differs'].get(key))}")
    return separator.join(parts) or row["run"]


def _error_bars(rows: list[dict[str, Any]], name: str) -> list[list[float]]:
    """Matplotlib's asymmetric yerr: distances from each mean down and up to its interval's ends
    (none where a row has no interval: one run, or no figure)."""
    below, above = [], []
    for row in rows:
        mean, low, high = row[name], row[f"{name}_ci95_low"], row[f"{name}_ci95_high"]
        has_interval = finite(mean) and finite(low) and finite(high)
        below.append(mean - low if has_interval else math.nan)  # nan: no error bar drawn
        above.append(high - mean if has_interval else math.nan)
    return [below, above]


def _or_zero(value: Any) -> float:
    return float(value) if finite(value) else 0.0
