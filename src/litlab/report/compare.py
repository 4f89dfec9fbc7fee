"""Compare runs: one row per configuration against its baseline (speed-up, memory ratio, metric
delta); what a row counts and combines is in docs/sweeps.md."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from litlab.report.collect import ALIASES, CODE_KEY, CompareError, RunResult, override_key
from litlab.report.stats import SIGNIFICANCE, estimate, welch_p_value
from litlab.run.summary import COMPLETED, INTERRUPTED, NOT_STARTED, PRUNED, Summary, finite
from litlab.run.sweep_record import SKIPPED

DEFAULT_BASELINE = "precision=fp32 trainer.accumulate_grad_batches=1"
_REPEAT_KEY = "seed"  # runs that differ only in it are repeats of one configuration: one row
DEVICE_KEYS = {"trainer.devices", "trainer.num_nodes"}
# Keys with a column of their own; other keys that differ between runs go into the "differs" column.
_OWN_COLUMN = {"precision", "trainer.accumulate_grad_batches", *DEVICE_KEYS}
# The micro-batch column's key: in "differs" only for runs without recorded settings (which hold it).
MICRO_BATCH = "data.batch_size"
# Groups that choose which jobs a multirun has, not how a run trains (their settings are overrides).
_NOT_SETTINGS = {"sweep", "hparams_search"}


@dataclass
class Report:
    rows: list[dict[str, Any]]  # one per configuration: its completed runs together, others alone
    metric: str | None  # None: no run has a metric to compare (optimized_metric=null)
    metric_mode: str  # "max": higher is better; "min": lower is better (a loss, a perplexity)
    test_metric: str | None
    baseline: str
    swept_keys: list[str]  # keys whose value differs between the configurations
    context_keys: list[str]  # besides devices x nodes, what a row and its baseline share
    throughput_unit: str = "samples"  # "tokens" when every completed run counted tokens
    notes: list[str] = field(default_factory=list)  # runs reached twice, jobs that trained one run
    skipped: list[str] = field(default_factory=list)  # "#0: completed earlier (...); not trained again"

    @property
    def unfinished(self) -> list[dict[str, Any]]:
        """Rows that did not complete; a sweep or litlab-compare with any exits 1."""
        return [row for row in self.rows if unfinished(row)]

    def unfinished_line(self, report_md: Path) -> str:
        return f"{len(self.unfinished)} of {len(self.rows)} rows did not complete: see {report_md}"

    @property
    def run_count(self) -> int:
        return sum(row["n"] for row in self.rows)


def unfinished(row: dict[str, Any]) -> bool:
    """Failed, interrupted, not started or running (a pruned trial ended as its search wanted)."""
    return row["status"] not in (COMPLETED, PRUNED)


def build_report(
    runs: Sequence[RunResult], baseline: str = DEFAULT_BASELINE, metric: str | None = None
) -> Report:
    """One row per configuration, each compared with its baseline; ``metric``: ``name[:min|max]``."""
    if not runs:
        raise CompareError("no runs to compare")
    runs, notes = _distinct_runs(runs)
    spec = parse_baseline(baseline)
    metric, mode = _metric(runs, metric)
    test = "test/" + metric.split("/", 1)[1] if metric and metric.startswith("val/") else None
    swept = _swept_keys(runs)
    repeat_key = _REPEAT_KEY if _REPEAT_KEY in swept and _REPEAT_KEY not in spec else None
    settings = [k for k in swept if k != repeat_key]
    context_keys = [k for k in settings if k not in spec and k not in DEVICE_KEYS]
    configurations = _configurations(runs, settings, repeat_key)
    rows = [_row(group, metric, test, settings, repeat_key) for group in configurations]
    _compare_with_baselines(configurations, rows, spec, context_keys, mode)
    counted = [row["tokens_per_second"] for row in rows if row["status"] == COMPLETED]
    unit = "tokens" if counted and all(tokens is not None for tokens in counted) else "samples"
    notes += [
        f"the overrides `{' '.join(overrides)}` train the same run as {run.label}: it ran once"
        for run in runs
        for overrides in run.same_run_overrides
    ]
    skipped = [f"{run.label}: {run.note or 'completed earlier'}" for run in runs if run.outcome == SKIPPED]
    return Report(rows, metric, mode, test, baseline, settings, context_keys, unit, notes, skipped)


def _compare_with_baselines(
    configurations: list[list[RunResult]],
    rows: list[dict[str, Any]],
    spec: dict[str, str],
    context_keys: list[str],
    mode: str,
) -> None:
    """Compare each row with the first completed row that matches ``spec`` in its context: the same
    devices x nodes (unless ``spec`` names them) and value of each of ``context_keys``."""
    with_devices = not (DEVICE_KEYS & spec.keys())
    contexts, baselines = [], {}
    for group, row in zip(configurations, rows, strict=True):
        run = group[0]
        devices = [run.summary.devices, run.summary.num_nodes] if with_devices else []
        key = json.dumps([*devices, *(run.values.get(k) for k in context_keys)], default=str)
        contexts.append(key)
        matches = row["status"] == COMPLETED and all(_same(run.values.get(k), v) for k, v in spec.items())
        old = baselines.get(key)
        # Runs resumed across a change are the baseline only where no other configuration matches.
        if matches and (old is None or (old["resumed_across"] and not row["resumed_across"])):
            baselines[key] = row
    for row, key in zip(rows, contexts, strict=True):
        # A configuration alone in its context (every Optuna trial) has nothing to be compared with.
        if key in baselines and contexts.count(key) > 1:
            _compare(row, baselines[key], mode)


def _distinct_runs(runs: Sequence[RunResult]) -> tuple[list[RunResult], list[str]]:
    """Each run (name and folder) once: its latest attempt that started, with every attempt's timing."""
    attempts: dict[tuple[Any, ...], list[RunResult]] = {}
    for index, run in enumerate(runs):
        summary = run.summary
        folder = Path(str(summary.storage_dir or summary.run_dir)).name
        key = (summary.run_name, folder) if summary.run_name else ("", index)  # a stand-in of its own
        attempts.setdefault(key, []).append(run)
    distinct, notes = [], []
    for same in attempts.values():
        final = max(same, key=_recency)
        timings = {t["started_at"]: t for run in same for t in run.timings}  # a skipped copy: one timing
        final.timings = list(timings.values())
        distinct.append(final)
        if len(same) > 1:
            labels = ", ".join(run.label for run in same)
            what = f"{final.summary.run_name}, {final.summary.status}"
            notes.append(f"{labels} are attempts of one run ({what}): counted once, as {final.label}")
    return distinct, notes


def _recency(run: RunResult) -> tuple[bool, str, str]:
    summary = run.summary
    return summary.status != NOT_STARTED, summary.started_at or "", summary.finished_at or ""


def _configurations(
    runs: Sequence[RunResult], settings: list[str], repeat_key: str | None
) -> list[list[RunResult]]:
    """Completed runs alike in all but ``repeat_key`` together; a run that did not complete alone."""
    not_identity = {repeat_key, "hydra", *_NOT_SETTINGS}
    groups: dict[str, list[RunResult]] = {}
    for index, run in enumerate(runs):
        summary = run.summary
        if not summary.completed:
            groups[f"not completed {index}"] = [run]
            continue
        ran = [summary.devices, summary.num_nodes, summary.code_fingerprint, summary.resumed_across]
        if summary.settings:
            ran.append({k: v for k, v in summary.settings.items() if k != repeat_key})
        else:  # older summaries: options, swept values and overrides
            ran.append({k: v for k, v in (summary.groups or {}).items() if k not in _NOT_SETTINGS})
            ran.append([run.values.get(k) for k in settings])
            ran.append(sorted(o for o in summary.overrides or [] if override_key(o) not in not_identity))
        groups.setdefault(json.dumps(ran, default=str, sort_keys=True), []).append(run)
    return list(groups.values())


def parse_baseline(text: str) -> dict[str, str]:
    """``"precision=fp32 trainer.accumulate_grad_batches=1"`` -> {key: value}; aliases resolved."""
    spec = {}
    for item in text.replace(",", " ").split():
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise CompareError(f"baseline item '{item}' is not key=value (e.g. {DEFAULT_BASELINE})")
        spec[ALIASES.get(key, key)] = value
    if not spec:
        raise CompareError(f"the baseline is empty: give key=value pairs, e.g. {DEFAULT_BASELINE}")
    return spec


def _metric(runs: Sequence[RunResult], asked: str | None) -> tuple[str | None, str]:
    """The metric and its direction: ``asked`` (``name[:min|max]``) or the runs' optimized_metric
    (whose mode is also its val/ and test/ twins'); None when nothing names one."""
    first = next((run.values for run in runs if run.values.get("optimized_metric")), {})
    optimized = first.get("optimized_metric")
    logged = sorted({name for run in runs for name in run.summary.metrics or {}})
    if not asked and not optimized and "val/acc" not in logged:
        return None, "max"
    name, _, mode = (asked or optimized or "val/acc").partition(":")
    if mode not in ("", "min", "max"):
        raise CompareError(f"--metric {asked}: the direction after ':' is min or max")
    if asked and logged and name not in logged:
        raise CompareError(f"--metric {name}: no run logged it; the runs logged {', '.join(logged)}")
    if not mode and (optimized is None or name.split("/")[-1] == optimized.split("/")[-1]):
        mode = str(first.get("optimized_metric_mode") or "max")
    if not mode:
        raise CompareError(
            f"--metric {name}: the runs record the direction of {optimized} only; say which way is better: "
            f"--metric {name}:min or --metric {name}:max"
        )
    return name, mode


def _swept_keys(runs: Sequence[RunResult]) -> list[str]:
    """Keys whose value differs between the runs (settings, older runs' overrides), ``code`` among them."""
    recorded = [run for run in runs if run.summary.settings]
    keys = _differing_settings(recorded) if recorded else []
    older = [run for run in runs if not run.summary.settings]
    typed = [k for k in _typed_keys(older) if k != "hydra" and k not in _NOT_SETTINGS]
    keys += [k for k in typed if _differ(run.values.get(k) for run in older)]
    if len({run.summary.code_fingerprint for run in runs if run.summary.code_fingerprint}) > 1:
        keys.append(CODE_KEY)
    return list(dict.fromkeys(keys))


def _differing_settings(runs: Sequence[RunResult]) -> list[str]:
    """Setting keys whose value differs, the command line's first; a group whose choice differs stands
    for the keys whose value follows that choice (``model``, not mlp's ``model.width``)."""
    names = dict.fromkeys(key for run in runs for key in run.summary.settings or {})
    differing = [k for k in names if _differ((run.summary.settings or {}).get(k) for run in runs)]
    choices = dict.fromkeys(group for run in runs for group in run.summary.groups or {})
    chosen = [g for g in choices if g not in _NOT_SETTINGS and _differ(run.values.get(g) for run in runs)]
    keys = []
    for key in differing:
        owners = [
            g for g in chosen if f"{key}.".startswith(g.replace("/", ".") + ".") and _follows(runs, g, key)
        ]
        keys.append(max(owners, key=len) if owners else key)
    order = {key: position for position, key in enumerate(_typed_keys(runs))}
    return sorted(dict.fromkeys(keys), key=lambda key: order.get(key, len(order)))


def _follows(runs: Sequence[RunResult], group: str, key: str) -> bool:
    """Whether runs with the same option of ``group`` have the same value of ``key``."""
    values: dict[str, list[Any]] = {}
    for run in runs:
        values.setdefault(str(run.values.get(group)), []).append((run.summary.settings or {}).get(key))
    return not any(_differ(same_choice) for same_choice in values.values())


def _differ(values: Any) -> bool:
    return len({json.dumps(value, default=str, sort_keys=True) for value in values}) > 1


def _typed_keys(runs: Sequence[RunResult]) -> list[str]:
    """The keys the runs' command lines set, in their order (``override_key``)."""
    return list(dict.fromkeys(override_key(o) for run in runs for o in run.summary.overrides or []))


def _same(value: Any, wanted: str) -> bool:
    try:
        return str(value) == wanted or float(value) == float(wanted)
    except (TypeError, ValueError):
        return False


def _latest_per_seed(runs: list[RunResult], repeat_key: str | None) -> dict[Any, Summary]:
    """Each seed's latest run; a run whose seed is not known is a seed of its own."""
    seeds: dict[Any, Summary] = {}
    for index, run in enumerate(runs):
        seed = run.values.get(repeat_key or _REPEAT_KEY)
        key = ("run", index) if seed is None else seed
        if key not in seeds or (run.summary.started_at or "") > (seeds[key].started_at or ""):
            seeds[key] = run.summary
    return seeds


def _interval(name: str, values: list[Any], comparable: bool = True) -> dict[str, Any]:
    # A figure some of the seeds lack has no mean: it would be the mean of other runs than n says.
    mean, low, high = estimate(values) if comparable and values and None not in values else (None,) * 3
    return {name: mean, f"{name}_ci95_low": low, f"{name}_ci95_high": high}


def _row(
    runs: list[RunResult],
    metric: str | None,
    test_metric: str | None,
    swept: list[str],
    repeat_key: str | None,
) -> dict[str, Any]:
    """A configuration's row, its fields in report.csv's order: each figure's mean and 95 % interval
    over one value per distinct seed, throughput over its timings; ``_compare`` fills in the comparison."""
    summary, seeds = runs[0].summary, _latest_per_seed(runs, repeat_key)
    timings = [t for run in runs for t in run.timings]
    timings = [t for t in timings if not t["shared"]] or timings  # solo ones where any, never mixed

    def each(field: str, name: str | None) -> list[Any]:
        return [(getattr(seed, field) or {}).get(name) for seed in seeds.values()]

    memory_kinds = set(each("memory", "kind"))
    memory_kind = memory_kinds.pop() if len(memory_kinds) == 1 else None
    findings = [entry for run in runs for entry in run.summary.diagnosis or []]  # litlab.run.doctor's
    own_column = {*_OWN_COLUMN, *([MICRO_BATCH] if summary.settings else [])}
    recorded = ("accumulate_grad_batches", "devices", "num_nodes", "micro_batch_size", "effective_batch_size")
    return {
        "run": ", ".join(run.label for run in runs),
        "status": summary.status,
        "differs": {
            k: runs[0].values.get(k) for k in swept if k not in own_column and not k.startswith("precision.")
        },
        "n": len(seeds),
        "seeds": [key for key in seeds if not isinstance(key, tuple)] if repeat_key else [],
        "precision": (summary.groups or {}).get("precision"),
        "precision_requested": (summary.precision or {}).get("requested"),
        "precision_effective": (summary.precision or {}).get("effective"),
        **{name: getattr(summary, name) for name in recorded},
        **_interval("samples_per_second", [t["samples_per_second"] for t in timings]),
        **_interval("tokens_per_second", [t.get("tokens_per_second") for t in timings]),
        "timings": len(timings),
        "timed_by": sorted({t["by"] for t in timings}),
        "seconds_per_epoch": estimate(each("throughput", "seconds_per_epoch")).mean,
        "memory_kind": memory_kind,
        **_interval("peak_memory_mib", each("memory", "peak_mib"), memory_kind is not None),
        **_interval("metric", each("metrics", metric)),
        "test_metric": estimate(each("metrics", test_metric)).mean,
        # What ``_compare`` fills in: None until then.
        **dict.fromkeys(
            ("speed_up", "speed_up_p_value", "speed_up_significant", "timed_apart", "memory_ratio")
        ),
        **dict.fromkeys(("metric_delta", "metric_delta_p_value", "metric_delta_significant")),
        **dict.fromkeys(("seconds_to_baseline", "baseline")),
        "is_baseline": False,
        "pruned_epoch": summary.pruned_epoch,
        # Timed beside other jobs or processes (the pool's record of the attempt): not a solo timing.
        "shared_node": bool(timings) and all(t["shared"] for t in timings),
        "resumed_across": list(dict.fromkeys(c for run in runs for c in run.summary.resumed_across or [])),
        "diagnosis": list(dict.fromkeys(entry.get("symptom") for entry in findings)),
        "error": _error_text(summary),
        "run_dir": ";".join(str(run.dir) for run in runs),
        # Not report.csv's (render's ``_NOT_CSV``): why a figure was not tested, the values behind
        # Welch's tests, the doctor's findings, a curve per seed.
        "not_tested": None,
        "samples_per_second_values": [t["samples_per_second"] for t in timings],
        "metric_values": each("metrics", metric),
        "findings": findings,
        "curves": [curve(seed, metric) for seed in seeds.values()],
    }


def _compare(row: dict[str, Any], base: dict[str, Any], mode: str) -> None:
    """``row`` against its baseline's row ``base``: ratios, Welch's p-values, seconds to the baseline's
    metric; a speed-up timed under other conditions (another start, solo against shared) is not tested."""
    row["baseline"], row["is_baseline"] = base["run"], base is row
    # Ratios only between completed runs: a failed run may have figures, not those of the run it meant to be.
    if row["status"] != COMPLETED:
        return
    row["speed_up"] = _ratio(row["samples_per_second"], base["samples_per_second"])
    row["timed_apart"] = (row["timed_by"], row["shared_node"]) != (base["timed_by"], base["shared_node"])
    if base["memory_kind"] == row["memory_kind"]:
        row["memory_ratio"] = _ratio(row["peak_memory_mib"], base["peak_memory_mib"])
    if finite(row["metric"]) and finite(base["metric"]):
        row["metric_delta"] = row["metric"] - base["metric"]
    if finite(base["metric"]):
        row["seconds_to_baseline"] = _seconds_to_baseline(row["curves"], base["metric"], mode)
    tested = base is not row  # the baseline against itself is 1.0x and +0, not a test
    if tested and (row["resumed_across"] or base["resumed_across"]):  # trained partly under each version
        tested, row["not_tested"] = False, "resumed across a change"
    for name, figure in (("speed_up", "samples_per_second"), ("metric_delta", "metric")):
        if row[name] is not None and tested and not (name == "speed_up" and row["timed_apart"]):
            p_value = welch_p_value(row[f"{figure}_values"], base[f"{figure}_values"])
            row[f"{name}_p_value"] = p_value
            row[f"{name}_significant"] = None if p_value is None else p_value < SIGNIFICANCE


def _error_text(summary: Any) -> str | None:
    """Why a run did not complete; an interrupted one is no failure: the same command resumes it."""
    if summary.status != INTERRUPTED:
        return summary.error
    if not summary.error or str(summary.error).startswith("SIGTERMException"):
        return "stopped by SIGTERM; the same command resumes it"
    return summary.error if "resumes it" in summary.error else f"{summary.error}; the same command resumes it"


def _seconds_to_baseline(
    curves: list[list[dict[str, float]]], target: float, mode: str
) -> float | str | None:
    """Mean seconds until the runs first reached ``target``; "never" if one did not; None without history."""
    if not all(curves):
        return None
    seconds = [seconds_to_reach(points, target, mode) for points in curves]
    missed = sum(s == "never" for s in seconds)
    if missed:
        return "never" if len(seconds) == 1 else f"never ({missed} of {len(seconds)} runs)"
    return math.fsum(seconds) / len(seconds)


def curve(summary: Any, metric: str | None) -> list[dict[str, float]]:
    """The run's ``metric`` per epoch from summary.json's history: wall seconds, samples seen, value."""
    points = []
    for entry in summary.history or []:
        value = (entry.get("metrics") or {}).get(metric)
        if finite(value) and finite(entry.get("wall_s")):
            points.append({"wall_s": entry["wall_s"], "samples": entry.get("samples"), "value": value})
    return points


def seconds_to_reach(points: list[dict[str, float]], target: float, mode: str) -> float | str:
    """Wall seconds at the first epoch at least as good as ``target`` in ``mode``'s direction, or "never"."""
    for point in points:
        if (point["value"] <= target) if mode == "min" else (point["value"] >= target):
            return point["wall_s"]
    return "never"


def _ratio(value: Any, reference: Any) -> float | None:
    return value / reference if finite(value) and finite(reference) and reference > 0 else None
