"""Compare runs: one row per configuration against its baseline (speed-up, memory ratio, metric delta).

Each run counts once. Completed runs that ran the same settings but their seed, with the same code
and devices x nodes, are one configuration, with mean, confidence interval and Welch's t-test
(``litlab.report.stats``). A row's baseline matches ``baseline`` and has the same devices x nodes, code
version and every other differing value; ratios are only between completed runs. ``build_report``
builds it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from litlab.report.collect import CompareError, RunResult
from litlab.report.stats import Estimate, estimate, significant, welch_p_value
from litlab.run.summary import COMPLETED, INTERRUPTED, PRUNED, finite
from litlab.run.sweep_record import SKIPPED

DEFAULT_BASELINE = "precision=fp32 trainer.accumulate_grad_batches=1"
# Runs that differ only in this key are repeats of one configuration: one row, with statistics.
REPEAT_KEY = "seed"
# Runs of different versions of the user's code differ in this pseudo key: code_fingerprint's first 8 hex.
CODE_KEY = "code"

# Config keys whose value a run's summary.json records as it ran (devices "auto" resolved, the
# micro-batch derived from a global batch): looked up there first.
_FROM_SUMMARY = {
    "trainer.accumulate_grad_batches": "accumulate_grad_batches",
    "trainer.devices": "devices",
    "trainer.num_nodes": "num_nodes",
    "data.batch_size": "micro_batch_size",
    "global_batch_size": "global_batch_size",
    "optimized_metric": "optimized_metric",
    "optimized_metric_mode": "optimized_metric_mode",
}
# Baseline keys may name a summary.json field; they mean the config key the user sweeps.
_ALIASES = {name: key for key, name in _FROM_SUMMARY.items()} | {
    "accumulation": "trainer.accumulate_grad_batches",
    "batch_size": "data.batch_size",
}
_DEVICE_KEYS = {"trainer.devices", "trainer.num_nodes"}
# Keys with a column of their own; other keys that differ between runs go into the "differs" column.
_OWN_COLUMN = {"precision", "trainer.accumulate_grad_batches", "trainer.devices", "trainer.num_nodes"}
# The micro-batch column's key: left out of "differs" for runs that recorded their settings, which
# hold it whenever it differs (for other runs, only a command line that swept it names it).
_MICRO_BATCH = "data.batch_size"
# Groups that choose which jobs a multirun has, not how a run trains (their settings are overrides).
_NOT_SETTINGS = {"sweep", "hparams_search"}
# A row's fields that are not report.csv's columns: the runs' values behind Welch's tests, why a test
# was not made, the doctor's findings and the learning curves.
ROW_INTERNALS = ("samples_per_second_values", "metric_values", "not_tested", "findings", "curves")


@dataclass
class Report:
    rows: list[dict[str, Any]]  # one per configuration: its completed runs together, others alone
    metric: str
    metric_mode: str  # "max": higher is better; "min": lower is better (a loss, a perplexity)
    test_metric: str | None
    baseline: str
    swept_keys: list[str]  # keys whose value differs between the configurations (``_swept_keys``)
    context_keys: list[str]  # besides devices x nodes, what a row and its baseline share
    throughput_unit: str = "samples"  # "tokens" when every completed run counted tokens
    sources: list[Path] = field(default_factory=list)
    repeat_key: str | None = None  # "seed" when the runs were repeated with several seeds
    notes: list[str] = field(default_factory=list)  # runs reached twice, jobs that trained one run
    skipped: list[str] = field(default_factory=list)  # "#0: completed earlier (...); not trained again"

    @property
    def unfinished(self) -> list[dict[str, Any]]:
        """Rows of runs that did not complete (``unfinished``); a sweep or litlab-compare with any exits 1."""
        return [row for row in self.rows if unfinished(row)]

    def unfinished_line(self, report_md: Path) -> str:
        """What a sweep and litlab-compare say before they exit 1."""
        return (
            f"{len(self.unfinished)} of {len(self.rows)} rows did not complete (failed, interrupted or "
            f"running elsewhere): see {report_md}"
        )

    @property
    def pruned(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["status"] == PRUNED]

    @property
    def run_count(self) -> int:
        return sum(row["n"] for row in self.rows)


def unfinished(row: dict[str, Any]) -> bool:
    """Whether a row's runs did not complete: failed, interrupted or running elsewhere (a pruned
    trial ended where its search wanted it to)."""
    return row["status"] not in (COMPLETED, PRUNED)


def build_report(
    runs: Sequence[RunResult],
    baseline: str = DEFAULT_BASELINE,
    metric: str | None = None,
    metric_mode: str | None = None,
) -> Report:
    """One row per configuration, each compared with its baseline configuration.

    A run reached twice (two sweeps' records of it) counts once. Completed runs that ran the same
    (``_configurations``) but for ``seed`` are one configuration: its row has their number n, the mean
    and 95 % confidence interval of each figure, and Welch's t-test of its runs against the
    baseline's (``litlab.report.stats``). A run that did not complete is a row of its own. The
    baseline is the first completed configuration that matches ``baseline`` (``key=value ...``) and
    has the same devices x nodes and the same value of every other key that differs between the
    runs (the code version among them). Naming ``trainer.devices`` in ``baseline`` compares every
    device count with that one configuration; naming ``seed`` compares single seeds instead of
    grouping them."""
    if not runs:
        raise CompareError("no runs to compare")
    runs, notes = _distinct_runs(runs)
    spec = parse_baseline(baseline)
    optimized, optimized_mode = _default_metric(runs)
    metric = metric or optimized
    # The direction is recorded for the optimized metric; its val/ and test/ twins share it.
    twin = metric.split("/")[-1] == optimized.split("/")[-1]
    mode = metric_mode or (optimized_mode if twin else "max")
    test_metric = "test/" + metric.split("/", 1)[1] if metric.startswith("val/") else None
    swept = _swept_keys(runs)
    repeat_key = REPEAT_KEY if REPEAT_KEY in swept and REPEAT_KEY not in spec else None
    settings = [k for k in swept if k != repeat_key]
    context_keys = [k for k in settings if k not in spec and k not in _DEVICE_KEYS]
    compare_devices = not (_DEVICE_KEYS & spec.keys())

    def context(run: RunResult) -> str:
        devices = [run.summary.devices, run.summary.num_nodes] if compare_devices else []
        return json.dumps([*devices, *(_lookup(run, k) for k in context_keys)], default=str)  # lists too

    configurations = _configurations(runs, settings, repeat_key)
    rows = [_row(group, metric, test_metric, settings, repeat_key) for group in configurations]
    contexts = [context(group[0]) for group in configurations]
    baselines: dict[str, dict[str, Any]] = {}
    for group, row, key in zip(configurations, rows, contexts, strict=True):
        matches = row["status"] == COMPLETED and all(_same(_lookup(group[0], k), v) for k, v in spec.items())
        # Runs resumed across a change are the baseline only where no other configuration matches.
        if matches and (
            key not in baselines or (baselines[key]["resumed_across"] and not row["resumed_across"])
        ):
            baselines[key] = row
    for row, key in zip(rows, contexts, strict=True):
        # A configuration alone in its context (every Optuna trial) has nothing to be compared with.
        if key in baselines and contexts.count(key) > 1:
            _compare(row, baselines[key], mode)
    counted = [row["tokens_per_second"] for row in rows if row["status"] == COMPLETED]
    unit = "tokens" if counted and all(tokens is not None for tokens in counted) else "samples"
    notes += [
        f"the overrides `{' '.join(overrides)}` train the same run as {run.label}: it ran once"
        for run in runs
        for overrides in run.same_run_overrides
    ]
    skipped = [
        f"{run.label}: {run.note or 'completed earlier; not trained again'}"
        for run in runs
        if run.outcome == SKIPPED
    ]
    return Report(
        rows,
        metric,
        mode,
        test_metric,
        baseline,
        settings,
        context_keys,
        unit,
        repeat_key=repeat_key,
        notes=notes,
        skipped=skipped,
    )


def _distinct_runs(runs: Sequence[RunResult]) -> tuple[list[RunResult], list[str]]:
    """Each run once, where it first appears, and a note per run reached more than once (two sweeps
    whose second found it completed both hold it; seed=2 in both sweeps given to litlab-compare).
    A run is its name, its storage folder and when it started and finished."""
    reached: dict[tuple[Any, ...], list[RunResult]] = {}
    distinct = []
    for run in runs:
        summary = run.summary
        if not (summary.run_name and summary.started_at):  # a stand-in for a run that wrote no summary
            distinct.append(run)
            continue
        where = summary.storage_dir or summary.run_dir
        same = reached.setdefault((summary.run_name, where, summary.started_at, summary.finished_at), [])
        if not same:
            distinct.append(run)
        same.append(run)
    notes = [
        f"{', '.join(run.label for run in same)} are one run ({same[0].summary.run_name}, started "
        f"{same[0].summary.started_at}): counted once, as {same[0].label}"
        for same in reached.values()
        if len(same) > 1
    ]
    return distinct, notes


def _configurations(
    runs: Sequence[RunResult], settings: list[str], repeat_key: str | None
) -> list[list[RunResult]]:
    """The runs grouped into configurations, in the order of each one's first run. Completed runs
    are one when they ran the same: the same devices x nodes, code version and change they were
    resumed across (mostly none), and the same recorded settings but ``repeat_key`` (the seed). Runs
    that recorded no settings (older summaries) are one when they have the same config group options,
    value of every swept setting and command-line overrides. A run that did not complete is one of
    its own."""
    not_identity = {repeat_key, "hydra", *_NOT_SETTINGS}
    groups: dict[str, list[RunResult]] = {}
    for index, run in enumerate(runs):
        if not run.summary.completed:
            groups[f"not completed {index}"] = [run]
            continue
        summary = run.summary
        ran: list[Any] = [summary.devices, summary.num_nodes]
        ran += [summary.code_fingerprint, summary.resumed_across]
        if summary.settings:
            ran.append({k: v for k, v in summary.settings.items() if k != repeat_key})
        else:
            ran.append({k: v for k, v in (summary.groups or {}).items() if k not in _NOT_SETTINGS})
            ran.append([_lookup(run, k) for k in settings])
            ran.append(sorted(o for o in summary.overrides or [] if _override_key(o) not in not_identity))
        groups.setdefault(json.dumps(ran, default=str, sort_keys=True), []).append(run)
    return list(groups.values())


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
        name = _lookup(run, "optimized_metric")
        if name:
            return str(name), str(_lookup(run, "optimized_metric_mode") or "max")
    return "val/acc", "max"


def _swept_keys(runs: Sequence[RunResult]) -> list[str]:
    """Keys whose value differs between the runs: from what ran for runs that recorded their
    settings, from the overrides for older runs; and ``code`` when the runs' code versions differ."""
    keys = _differing_settings([run for run in runs if run.summary.settings])
    keys += _swept_overrides([run for run in runs if not run.summary.settings])
    if len({run.summary.code_fingerprint for run in runs if run.summary.code_fingerprint}) > 1:
        keys.append(CODE_KEY)
    return list(dict.fromkeys(keys))


def _differing_settings(runs: Sequence[RunResult]) -> list[str]:
    """Setting keys whose value differs between ``runs`` (which recorded their settings), the keys
    set on the command line first. A config group whose choice differs is one key (``model``, not
    every ``model.*`` key)."""
    names = dict.fromkeys(key for run in runs for key in run.summary.settings or {})
    differing = [k for k in names if _differ((run.summary.settings or {}).get(k) for run in runs)]
    choices = dict.fromkeys(group for run in runs for group in run.summary.groups or {})
    chosen = [g for g in choices if g not in _NOT_SETTINGS and _differ(_choice(run, g) for run in runs)]
    keys = []
    for key in differing:
        owners = [g for g in chosen if f"{key}.".startswith(g.replace("/", ".") + ".")]
        # The group stands for its key where the key's value follows the choice (mlp's width is mlp's).
        owners = [g for g in owners if _follows_choice(runs, g, key)]
        keys.append(max(owners, key=len) if owners else key)
    order = {key: position for position, key in enumerate(_typed_keys(runs))}
    return sorted(dict.fromkeys(keys), key=lambda key: order.get(key, len(order)))


def _follows_choice(runs: Sequence[RunResult], group: str, key: str) -> bool:
    """Whether runs with the same option of ``group`` have the same value of ``key``."""
    values: dict[str, list[Any]] = {}
    for run in runs:
        values.setdefault(str(_choice(run, group)), []).append((run.summary.settings or {}).get(key))
    return not any(_differ(same_choice) for same_choice in values.values())


def _choice(run: RunResult, group: str) -> Any:
    return (run.summary.groups or {}).get(group)


def _differ(values: Any) -> bool:
    return len({json.dumps(value, default=str, sort_keys=True) for value in values}) > 1


def _swept_overrides(runs: Sequence[RunResult]) -> list[str]:
    """Override keys (in command-line order) whose value differs between the runs."""
    keys = [key for key in _typed_keys(runs) if key != "hydra" and key not in _NOT_SETTINGS]
    return [key for key in keys if _differ(_lookup(run, key) for run in runs)]


def _typed_keys(runs: Sequence[RunResult]) -> list[str]:
    """The keys the runs' command lines set, in their order (``_override_key``)."""
    return list(dict.fromkeys(_override_key(o) for run in runs for o in run.summary.overrides or []))


def _override_key(override: str) -> str:
    """The key an override sets, aliases resolved; "hydra" for any of Hydra's own."""
    key = override.split("=", 1)[0].lstrip("+~")
    return "hydra" if key.startswith("hydra") else _ALIASES.get(key, key)


def _lookup(run: RunResult, key: str) -> Any:
    """A run's value of a config key: its group option, its code version (``code``), what summary.json
    recorded as it ran, its recorded settings, its config, or its overrides."""
    summary = run.summary
    groups = summary.groups or {}
    if key in groups:
        return groups[key]
    if key == CODE_KEY:
        return summary.code_fingerprint[:8] if summary.code_fingerprint else None
    recorded = getattr(summary, _FROM_SUMMARY[key]) if key in _FROM_SUMMARY else None
    if recorded is not None:
        return recorded
    if summary.settings and key in summary.settings:
        return summary.settings[key]
    if run.config is not None:
        value = OmegaConf.select(run.config, key, default=None, throw_on_resolution_failure=False)
        if value is not None:
            return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    for override in summary.overrides or []:
        if _override_key(override) == key:
            return override.partition("=")[2]
    return None


def _same(value: Any, wanted: str) -> bool:
    if str(value) == wanted:
        return True
    try:
        return float(value) == float(wanted)
    except (TypeError, ValueError):
        return False


def _row(
    runs: list[RunResult], metric: str, test_metric: str | None, swept: list[str], repeat_key: str | None
) -> dict[str, Any]:
    """A configuration's row: its runs' figures (their means, with 95 % confidence intervals); what
    compares it with its baseline is ``_compare``'s, None until then. Its fields are report.csv's
    columns, in their order, then ``ROW_INTERNALS``."""
    first = runs[0]
    summary = first.summary
    precision = summary.precision or {}
    figures = [_figures(run, metric, test_metric) for run in runs]
    memory_kinds = {f["memory_kind"] for f in figures}
    memory_kind = memory_kinds.pop() if len(memory_kinds) == 1 else None
    one_run_memory = (summary.memory or {}) if len(runs) == 1 else {}  # its per-rank peaks
    findings = [entry for run in runs for entry in run.summary.diagnosis or []]  # litlab.run.doctor's

    def estimated(name: str, comparable: bool = True) -> Estimate:
        values = [f[name] for f in figures]
        # A figure some of the runs lack has no mean: it would be the mean of other runs than n says.
        return estimate(values) if comparable and None not in values else Estimate()

    def with_interval(name: str, comparable: bool = True) -> dict[str, float | None]:
        mean, low, high = estimated(name, comparable)
        return {name: mean, f"{name}_ci95_low": low, f"{name}_ci95_high": high}

    return {
        "run": ", ".join(run.label for run in runs),
        "status": summary.status,
        "n": len(runs),
        "seeds": [_lookup(run, repeat_key) for run in runs] if repeat_key else [],
        "precision": (summary.groups or {}).get("precision"),
        "precision_requested": precision.get("requested"),
        "precision_effective": precision.get("effective"),
        "accumulate_grad_batches": summary.accumulate_grad_batches,
        "devices": summary.devices,
        "num_nodes": summary.num_nodes,
        "micro_batch_size": summary.micro_batch_size,
        "effective_batch_size": summary.effective_batch_size,
        **with_interval("samples_per_second"),
        **with_interval("tokens_per_second"),
        "seconds_per_epoch": estimated("seconds_per_epoch").mean,
        "memory_kind": memory_kind,
        **with_interval("peak_memory_mib", memory_kind is not None),  # CUDA and RSS peaks have no mean
        # Per-rank lists of one run; those of several runs are summed up by the peak's mean and interval.
        "max_allocated_mib_per_rank": one_run_memory.get("max_allocated_mib_per_rank"),
        "max_reserved_mib_per_rank": one_run_memory.get("max_reserved_mib_per_rank"),
        "peak_rss_mib_per_rank": one_run_memory.get("peak_rss_mib_per_rank"),
        **with_interval("metric"),
        "test_metric": estimated("test_metric").mean,
        "speed_up": None,
        "speed_up_p_value": None,
        "speed_up_significant": None,
        "memory_ratio": None,
        "metric_delta": None,
        "metric_delta_p_value": None,
        "metric_delta_significant": None,
        "seconds_to_baseline": None,  # seconds until the metric first reached the baseline's final value
        "baseline": None,
        "is_baseline": False,
        "pruned_epoch": summary.pruned_epoch,
        # Jobs that ran beside it on the node: not a solo timing. The pool's record of each job, in the
        # sweep's record (.jobs/<job>.json: its summary copy's sweep.beside), never in the run's summary.json.
        "shared_node": any((run.summary.sweep or {}).get("beside") for run in runs),
        "resumed_across": list(dict.fromkeys(c for run in runs for c in run.summary.resumed_across or [])),
        "differs": {k: _lookup(first, k) for k in swept if not _has_own_column(k, first)},
        "diagnosis": list(dict.fromkeys(entry.get("symptom") for entry in findings)),
        "error": _error_text(summary),
        "run_dir": ";".join(str(run.dir) for run in runs),
        # ROW_INTERNALS
        "samples_per_second_values": [f["samples_per_second"] for f in figures],  # for Welch's test
        "metric_values": [f["metric"] for f in figures],
        "not_tested": None,  # why Welch's test was not made where it could have been
        "findings": findings,
        "curves": [f["curve"] for f in figures],  # one per run, for report.png
    }


def _compare(row: dict[str, Any], base: dict[str, Any], mode: str) -> None:
    """``row`` against its baseline's row ``base`` (a completed configuration): speed-up, memory ratio
    and metric delta with Welch's p-values, and the seconds to the baseline's final metric."""
    row["baseline"], row["is_baseline"] = base["run"], base is row
    # Ratios only between completed runs: a failed run may have figures, not those of the run it meant to be.
    if row["status"] != COMPLETED:
        return
    row["speed_up"] = _ratio(row["samples_per_second"], base["samples_per_second"])
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
        if row[name] is not None and tested:
            p_value = welch_p_value(row[f"{figure}_values"], base[f"{figure}_values"])
            row[f"{name}_p_value"], row[f"{name}_significant"] = p_value, significant(p_value)


def _has_own_column(key: str, run: RunResult) -> bool:
    if key == _MICRO_BATCH:
        return bool(run.summary.settings)
    return key in _OWN_COLUMN or key.startswith("precision.")


def _error_text(summary: Any) -> str | None:
    """Why a run did not complete. An interrupted run was stopped (SIGTERM, or its sweep stopped
    before it started): not a failure, and the same command resumes it."""
    if summary.status != INTERRUPTED:
        return summary.error
    if not summary.error or str(summary.error).startswith("SIGTERMException"):
        return "stopped by SIGTERM; the same command resumes it"
    return f"{summary.error}; the same command resumes it"


def _figures(run: RunResult, metric: str, test_metric: str | None) -> dict[str, Any]:
    """One run's own figures, from its summary.json."""
    summary = run.summary
    throughput = summary.throughput or {}
    memory = summary.memory or {}
    metrics = summary.metrics or {}
    return {
        "samples_per_second": throughput.get("samples_per_second"),
        "tokens_per_second": throughput.get("tokens_per_second"),
        "seconds_per_epoch": throughput.get("seconds_per_epoch"),
        "memory_kind": memory.get("kind"),
        "peak_memory_mib": memory.get("peak_mib"),
        "metric": metrics.get(metric),
        "test_metric": metrics.get(test_metric) if test_metric else None,
        "curve": curve(summary, metric),
    }


def _seconds_to_baseline(
    curves: list[list[dict[str, float]]], target: float, mode: str
) -> float | str | None:
    """Mean seconds until the runs first reached ``target``; "never" when one of them did not;
    None when a run has no per-epoch history."""
    if not all(curves):
        return None
    seconds = [seconds_to_reach(points, target, mode) for points in curves]
    missed = sum(s == "never" for s in seconds)
    if missed:
        return "never" if len(seconds) == 1 else f"never ({missed} of {len(seconds)} runs)"
    return math.fsum(seconds) / len(seconds)


def curve(summary: Any, metric: str) -> list[dict[str, float]]:
    """The run's ``metric`` per epoch from summary.json's history: wall seconds, samples seen, value."""
    points = []
    for entry in summary.history or []:
        value = (entry.get("metrics") or {}).get(metric)
        if finite(value) and finite(entry.get("wall_s")):
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
    return value / reference if finite(value) and finite(reference) and reference > 0 else None
