"""The sweep report's comparison (``litlab.report.compare``) on runs built in memory: how a baseline
is parsed and found, which metric and direction a report uses, and the figures a row gets (speed-up,
memory ratio, metric delta, seconds to the baseline's metric) only where both runs completed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from litlab.report.collect import CompareError, RunResult, collect_runs
from litlab.report.compare import (
    DEFAULT_BASELINE,
    build_report,
    curve,
    parse_baseline,
    seconds_to_reach,
)
from litlab.run.summary import Summary


def run(label: str, *overrides: str, status: str = "completed", **fields):
    """A run as collect_runs reads it: a summary (the fields given)."""
    defaults = {
        "groups": {"precision": "fp32"},
        "devices": 1,
        "num_nodes": 1,
        "accumulate_grad_batches": 1,
        "metrics": {"val/acc": 0.9},
        "throughput": {"samples_per_second": 100.0},
        "memory": {"kind": "cpu_rss", "peak_mib": 200.0},
    }
    summary = Summary(status=status, overrides=list(overrides), **{**defaults, **fields})
    return RunResult(label, Path("/runs") / label, summary)


def row_of(report, label: str) -> dict:
    (row,) = [r for r in report.rows if r["run"] == label]
    return row


def test_a_baseline_is_key_value_pairs_with_summary_names_meaning_config_keys():
    assert parse_baseline(DEFAULT_BASELINE) == {"precision": "fp32", "trainer.accumulate_grad_batches": "1"}
    assert parse_baseline("accumulation=2,devices=4 batch_size=8") == {
        "trainer.accumulate_grad_batches": "2",
        "trainer.devices": "4",
        "data.batch_size": "8",
    }


@pytest.mark.parametrize("text", ["precision", "=fp32", "precision=", "precision=fp32 x"])
def test_a_baseline_item_that_is_not_key_value_is_refused_naming_it(text):
    item = text.split()[-1]
    with pytest.raises(CompareError) as raised:
        parse_baseline(text)
    assert str(raised.value) == f"baseline item '{item}' is not key=value (e.g. {DEFAULT_BASELINE})"


def test_an_empty_baseline_is_refused():
    with pytest.raises(CompareError) as raised:
        parse_baseline(" , ")
    assert str(raised.value) == f"the baseline is empty: give key=value pairs, e.g. {DEFAULT_BASELINE}"


def test_no_runs_is_an_error():
    with pytest.raises(CompareError, match="^no runs to compare$"):
        build_report([])


def test_each_row_gets_the_ratios_against_its_baseline():
    base = run("a", "precision=fp32")
    fast = run(
        "b",
        "precision=bf16",
        groups={"precision": "bf16"},
        throughput={"samples_per_second": 250.0},
        memory={"kind": "cpu_rss", "peak_mib": 50.0},
        metrics={"val/acc": 0.85},
    )
    report = build_report([base, fast])
    assert report.swept_keys == ["precision"] and report.metric == "val/acc" and report.metric_mode == "max"
    assert report.test_metric == "test/acc" and report.throughput_unit == "samples"
    row = row_of(report, "b")
    assert (row["baseline"], row["is_baseline"]) == ("a", False)
    assert row["speed_up"] == 2.5 and row["memory_ratio"] == 0.25
    assert math.isclose(row["metric_delta"], -0.05)
    assert row_of(report, "a")["is_baseline"] is True and row_of(report, "a")["speed_up"] == 1.0


def test_ratios_against_slow_baselines_below_one_sample_per_second():
    base = run("a", "precision=fp32", throughput={"samples_per_second": 0.5})
    other = run("b", "precision=bf16", groups={"precision": "bf16"}, throughput={"samples_per_second": 1.0})
    assert row_of(build_report([base, other]), "b")["speed_up"] == 2.0


def test_values_are_read_from_the_summary_not_the_config_a_run_saved():
    # Its config's interpolations may not resolve outside the run: the summary says what ran.
    runs = [
        run("a", "precision=fp32", "paths.output_dir=x"),
        run("b", "precision=bf16", "paths.output_dir=y", groups={"precision": "bf16"}),
    ]
    report = build_report(runs)
    assert report.metric == "val/acc"  # no optimized_metric recorded: the default
    assert row_of(report, "b")["differs"] == {"paths.output_dir": "y"}  # from the override


def test_memory_of_different_kinds_is_not_compared():
    base = run("a", "precision=fp32")
    other = run(
        "b", "precision=bf16", groups={"precision": "bf16"}, memory={"kind": "cuda", "peak_mib": 50.0}
    )
    row = row_of(build_report([base, other]), "b")
    assert row["memory_ratio"] is None and row["speed_up"] == 1.0


@pytest.mark.parametrize(
    ("base_figures", "figures"),
    [
        ({"throughput": {"samples_per_second": 0.0}}, {}),
        ({"throughput": {}}, {}),
        ({}, {"throughput": {"samples_per_second": float("nan")}}),
    ],
)
def test_no_ratio_against_a_zero_missing_or_non_finite_figure(base_figures, figures):
    base = run("a", "precision=fp32", **base_figures)
    other = run("b", "precision=bf16", groups={"precision": "bf16"}, **figures)
    assert row_of(build_report([base, other]), "b")["speed_up"] is None


def test_no_metric_delta_when_either_metric_is_missing_or_not_finite():
    base = run("a", "precision=fp32", metrics={"val/acc": float("inf")})
    history = [{"wall_s": 1.0, "metrics": {"val/acc": 0.5}}]
    other = run("b", "precision=bf16", groups={"precision": "bf16"}, history=history)
    row = row_of(build_report([base, other]), "b")
    assert row["metric_delta"] is None and row["seconds_to_baseline"] is None
    other = run("b", "precision=bf16", groups={"precision": "bf16"}, metrics={})
    assert row_of(build_report([run("a", "precision=fp32"), other]), "b")["metric_delta"] is None


def test_a_baseline_must_have_completed_and_a_failed_run_gets_no_figures():
    failed_base = run("a", "precision=fp32", status="failed")
    base = run("c", "precision=fp32")
    failed = run("b", "precision=bf16", status="failed", groups={"precision": "bf16"})
    report = build_report([failed_base, failed, base])
    assert [r["baseline"] for r in report.rows] == ["c", "c", "c"]
    row = row_of(report, "b")
    assert row["speed_up"] is row["memory_ratio"] is row["metric_delta"] is None
    assert [r["run"] for r in [r for r in report.rows if r["status"] == "failed"]] == ["a", "b"]


def test_numbers_in_the_baseline_match_whatever_their_spelling():
    base = run("a", "precision=fp32", "optimizer.lr=0.01")
    other = run("b", "precision=fp32", "optimizer.lr=1e-1")
    report = build_report([base, other], baseline="optimizer.lr=1e-2")
    assert [r["baseline"] for r in report.rows] == ["a", "a"]
    assert report.context_keys == []  # the baseline's key is what rows differ in, not their context
    report = build_report([base, other], baseline="optimizer.lr=abc")
    assert [r["baseline"] for r in report.rows] == [None, None]


def test_device_counts_are_compared_within_their_own_count_unless_the_baseline_names_one():
    runs = [
        run("a", "trainer.devices=1", "precision=fp32"),
        run("b", "trainer.devices=1", "precision=bf16", groups={"precision": "bf16"}),
        run("c", "trainer.devices=2", "precision=fp32", devices=2),
        run("d", "trainer.devices=2", "precision=bf16", groups={"precision": "bf16"}, devices=2),
    ]
    assert [r["baseline"] for r in build_report(runs).rows] == ["a", "a", "c", "c"]
    named = build_report(runs, baseline="precision=fp32 devices=1")
    assert [r["baseline"] for r in named.rows] == ["a", "a", "a", "a"]
    assert row_of(named, "c")["differs"] == {}  # devices and precision have columns of their own


def test_a_run_alone_in_its_context_has_no_baseline():
    runs = [
        run("a", "precision=fp32", "model=cnn", groups={"precision": "fp32", "model": "cnn"}),
        run("b", "precision=fp32", "model=mlp", groups={"precision": "fp32", "model": "mlp"}),
    ]
    report = build_report(runs, baseline="precision=fp32")
    assert report.swept_keys == ["model"] and report.context_keys == ["model"]
    assert [r["baseline"] for r in report.rows] == [None, None]
    assert row_of(report, "b")["differs"] == {"model": "mlp"}


def test_swept_keys_leave_out_hydra_and_the_groups_that_choose_the_jobs():
    runs = [
        run("a", "hydra.job.num=0", "sweep=grid", "+trainer.max_epochs=1", groups={"sweep": "grid"}),
        run("b", "hydra.job.num=1", "sweep=other", "+trainer.max_epochs=2", groups={"sweep": "other"}),
    ]
    assert build_report(runs).swept_keys == ["trainer.max_epochs"]
    assert row_of(build_report(runs), "b")["differs"] == {"trainer.max_epochs": 2}


def test_a_key_is_looked_up_in_the_groups_then_the_summary_then_the_overrides():
    runs = [
        run("a", "accumulation=1", "data.batch_size=8"),
        run("b", "accumulation=2", "data.batch_size=9", accumulate_grad_batches=2, micro_batch_size=16),
    ]
    report = build_report(runs, baseline="data.batch_size=8")
    # accumulation comes from summary.json; b's micro-batch as it ran (16), a's from its override (8)
    assert report.swept_keys == ["trainer.accumulate_grad_batches", "data.batch_size"]
    assert [r["baseline"] for r in report.rows] == [None, None]  # accumulation 1 and 2: no shared context
    assert row_of(report, "a")["differs"] == {"data.batch_size": 8}
    assert row_of(report, "b")["differs"] == {"data.batch_size": 16}


def test_list_values_are_compared_as_values():
    runs = [
        run("a", "precision=fp32", "model.sizes=[1,2]"),
        run("b", "precision=bf16", "model.sizes=[1,2]"),
    ]
    report = build_report(runs)
    assert report.swept_keys == [] and [r["baseline"] for r in report.rows] == ["a", "a"]


def test_the_metric_and_its_direction_come_from_the_runs_optimized_metric():
    logged = {"val/loss": 0.3, "test/loss": 0.31, "val/acc": 0.9}
    runs = [
        run("a", "precision=fp32", optimized_metric="val/loss", optimized_metric_mode="min", metrics=logged),
        run("b", "precision=bf16", groups={"precision": "bf16"}, optimized_metric="val/loss", metrics=logged),
    ]
    report = build_report(runs)
    assert (report.metric, report.metric_mode, report.test_metric) == ("val/loss", "min", "test/loss")
    twin = build_report(runs, metric="test/loss")
    assert (twin.metric_mode, twin.test_metric) == ("min", None)  # the test/ twin shares the direction
    assert build_report(runs, metric="val/acc:max").metric_mode == "max"
    assert build_report(runs, metric="val/loss:max").metric_mode == "max"  # said: it wins


def test_a_metric_whose_direction_no_run_records_must_be_given_one():
    """``--metric val/acc`` of runs optimizing val/loss used to get mode max silently: the headline's
    best and time-to-target then went the way nobody said."""
    runs = [run("a", optimized_metric="val/loss", optimized_metric_mode="min", metrics={"val/acc": 0.9})]
    with pytest.raises(CompareError) as refused:
        build_report(runs, metric="val/acc")
    assert str(refused.value) == (
        "--metric val/acc: the runs record the direction of val/loss only; say which way is better: "
        "--metric val/acc:min or --metric val/acc:max"
    )
    with pytest.raises(CompareError, match="the direction after ':' is min or max"):
        build_report(runs, metric="val/acc:up")


def test_a_metric_no_run_logged_is_refused_naming_the_logged_ones():
    runs = [run("a", metrics={"val/acc": 0.9, "val/loss": 0.2}), run("b", status="failed", metrics={})]
    with pytest.raises(CompareError) as refused:
        build_report(runs, metric="val/acuracy:max")
    assert str(refused.value) == "--metric val/acuracy: no run logged it; the runs logged val/acc, val/loss"


def test_a_metric_name_with_several_parts_keeps_them_in_its_twin_and_direction():
    logged = {"val/top1/acc": 0.5, "test/top5/acc": 0.6, "val/top1/loss": 0.1}
    runs = [run("a", optimized_metric="val/top1/acc", optimized_metric_mode="min", metrics=logged)]
    assert build_report(runs).test_metric == "test/top1/acc"
    assert build_report(runs, metric="test/top5/acc").metric_mode == "min"  # same last part: a twin
    with pytest.raises(CompareError, match="--metric val/top1/loss:min or"):
        build_report(runs, metric="val/top1/loss")


def test_the_report_records_the_baseline_it_was_asked_for():
    assert build_report([run("a")]).baseline == DEFAULT_BASELINE
    assert build_report([run("a")], baseline="devices=1").baseline == "devices=1"


def test_the_metric_of_a_job_that_wrote_no_summary_is_read_from_its_config(tmp_path):
    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    config = {"optimized_metric": "val/perplexity", "optimized_metric_mode": "min", "trainer": {"devices": 1}}
    OmegaConf.save(OmegaConf.create(config), tmp_path / "0" / ".hydra" / "config.yaml")
    report = build_report(collect_runs([tmp_path]))
    assert (report.metric, report.metric_mode) == ("val/perplexity", "min")
    assert (build_report([run("a")]).metric, build_report([run("a")]).metric_mode) == ("val/acc", "max")


def test_throughput_is_in_tokens_only_when_every_completed_run_counted_tokens():
    tokens = {"samples_per_second": 10.0, "tokens_per_second": 640.0}
    runs = [run("a", "precision=fp32", throughput=tokens), run("b", "precision=bf16", status="failed")]
    assert build_report(runs).throughput_unit == "tokens"
    runs.append(run("c", "precision=fp16"))
    assert build_report(runs).throughput_unit == "samples"
    assert build_report([run("a", status="failed")]).throughput_unit == "samples"


def test_the_curve_keeps_the_epochs_with_finite_values_and_times():
    history = [
        {"wall_s": 1.0, "samples": 10, "metrics": {"val/acc": 0.5}},
        {"wall_s": 2.0, "samples": 20, "metrics": {"val/acc": float("nan")}},
        {"wall_s": None, "samples": 30, "metrics": {"val/acc": 0.7}},
        {"wall_s": 4.0, "metrics": {"val/acc": 0.8}},
        {"wall_s": 5.0, "metrics": None},
    ]
    points = curve(Summary(status="completed", history=history), "val/acc")
    assert points == [
        {"wall_s": 1.0, "samples": 10, "value": 0.5},
        {"wall_s": 4.0, "samples": None, "value": 0.8},
    ]
    assert curve(Summary(status="completed"), "val/acc") == []


def test_seconds_to_reach_is_the_first_epoch_at_least_as_good_in_the_metrics_direction():
    points = [{"wall_s": 1.0, "value": 0.5}, {"wall_s": 2.0, "value": 0.7}, {"wall_s": 3.0, "value": 0.9}]
    assert seconds_to_reach(points, 0.7, "max") == 2.0
    assert seconds_to_reach(points, 0.95, "max") == "never"
    assert seconds_to_reach(points, 0.7, "min") == 1.0
    assert seconds_to_reach(points, 0.4, "min") == "never"
    assert seconds_to_reach(points, 0.5, "min") == 1.0  # reaching the target exactly counts
    assert seconds_to_reach(points, 0.9, "max") == 3.0


def test_a_row_gets_the_seconds_until_it_reached_its_baselines_final_metric():
    history = [{"wall_s": 3.0, "metrics": {"val/acc": 0.6}}, {"wall_s": 6.0, "metrics": {"val/acc": 0.95}}]
    runs = [
        run("a", "precision=fp32"),
        run("b", "precision=bf16", groups={"precision": "bf16"}, history=history),
    ]
    row = row_of(build_report(runs), "b")
    assert row["seconds_to_baseline"] == 6.0
    assert row["curves"] == [  # the row's one run's
        [{"wall_s": 3.0, "samples": None, "value": 0.6}, {"wall_s": 6.0, "samples": None, "value": 0.95}]
    ]


def test_seconds_to_the_baseline_follow_the_metrics_direction():
    history = [{"wall_s": 2.0, "metrics": {"val/loss": 0.9}}, {"wall_s": 4.0, "metrics": {"val/loss": 0.4}}]
    runs = [
        run(
            "a",
            "precision=fp32",
            metrics={"val/loss": 0.5},
            optimized_metric="val/loss",
            optimized_metric_mode="min",
        ),
        run("b", "precision=bf16", groups={"precision": "bf16"}, metrics={"val/loss": 0.4}, history=history),
    ]
    assert row_of(build_report(runs), "b")["seconds_to_baseline"] == 4.0


def test_values_with_an_equals_sign_and_dict_values_are_read_whole():
    runs = [
        run("a", "precision=fp32", "data.name=a=b", "model.net={width:1}"),
        run("b", "precision=fp32", "data.name=c=d", "model.net={width:2}"),
    ]
    report = build_report(runs, baseline="data.name=a=b")
    assert report.swept_keys == ["data.name", "model.net"]
    row = row_of(report, "b")
    assert row["differs"] == {"data.name": "c=d", "model.net": {"width": 2}}
    assert json.loads(json.dumps(row["differs"])) == row["differs"]  # plain values, as report.csv needs


def test_a_row_carries_the_runs_own_figures_and_findings():
    finding = {"symptom": "overfitting", "evidence": "val/loss rose", "cures": ["dropout"]}
    summary_fields = {
        "precision": {"requested": "bf16-mixed", "effective": "bf16-mixed"},
        "accumulate_grad_batches": 4,
        "devices": 2,
        "num_nodes": 3,
        "micro_batch_size": 8,
        "effective_batch_size": 32,
        "throughput": {"samples_per_second": 5.0, "tokens_per_second": 7.0, "seconds_per_epoch": 9.0},
        "memory": {
            "kind": "cuda",
            "peak_mib": 1.0,
            "max_allocated_mib_per_rank": [1.0],
            "max_reserved_mib_per_rank": [2.0],
            "peak_rss_mib_per_rank": [3.0],
        },
        "metrics": {"val/acc": 0.5, "test/acc": 0.4},
        "diagnosis": [finding],
        "error": "boom",
    }
    row = row_of(build_report([run("a", status="failed", **summary_fields)]), "a")
    expected = {
        "status": "failed",
        "precision": "fp32",
        "precision_requested": "bf16-mixed",
        "precision_effective": "bf16-mixed",
        "accumulate_grad_batches": 4,
        "devices": 2,
        "num_nodes": 3,
        "micro_batch_size": 8,
        "effective_batch_size": 32,
        "samples_per_second": None,  # a timing is a completed attempt's
        "tokens_per_second": None,
        "seconds_per_epoch": 9.0,
        "memory_kind": "cuda",
        "peak_memory_mib": 1.0,
        "metric": 0.5,
        "test_metric": 0.4,
        "diagnosis": ["overfitting"],
        "findings": [finding],
        "error": "boom",
        "run_dir": str(Path("/runs") / "a"),
    }
    assert {key: row[key] for key in expected} == expected
