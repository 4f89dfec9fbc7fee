"""The char_lm example through the engine's real commands: a run, litlab-eval on its best
checkpoint, a kill and resume, and a precision x accumulation sweep with its report.

One uninterrupted run (a module fixture, with test_resume.py's settings: checkpoints every 2 steps)
is checked as a run, evaluated, and is the reference the killed-and-resumed run must equal bitwise.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.conftest import TEST_SEED, litlab, ok, run_dirs, summary
from tests.integration.test_resume import (
    HOOKED,
    TOTAL_STEPS,
    Stop,
    assert_same_tensors,
    env_for,
    final_state,
    local_last_checkpoint,
    random_step,
    resumed_from,
    stop_at,
)
from tests.integration.test_sweeps import report_rows, summaries, sweep

pytestmark = pytest.mark.slow

# After test_resume.HOOKED (2 epochs of 10 batches of 32 sequences, cosine schedule), so these win.
CHAR_LM = ["experiment=char_lm", "test_after_fit=true"]


@pytest.fixture(scope="module")
def char_lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log_dir = tmp_path_factory.mktemp("char_lm") / "logs"
    ok(litlab("litlab-train", *HOOKED, *CHAR_LM, env=env_for(log_dir)))
    (run,) = run_dirs(log_dir)
    return run


def test_char_lm_run_reports_loss_perplexity_and_tokens_per_second(char_lm_run):
    result = summary(char_lm_run)
    assert result["status"] == "completed" and result["global_step"] == TOTAL_STEPS
    assert result["groups"]["model"] == "char_transformer" and result["groups"]["data"] == "pydoc_topics"
    assert (result["optimized_metric"], result["optimized_metric_mode"]) == ("val/loss", "min")
    metrics = result["metrics"]
    for split in ("val", "test"):
        assert math.isclose(metrics[f"{split}/perplexity"], math.exp(metrics[f"{split}/loss"]), rel_tol=1e-5)
    # 20 steps already beat a uniform guess over the 128 codes (ln 128 = 4.85 nats).
    assert metrics["val/loss"] < math.log(128)
    throughput = result["throughput"]
    # 64 characters are predicted per sequence of 65.
    assert throughput["tokens_per_second"] == pytest.approx(64 * throughput["samples_per_second"])
    assert result["resume_exact"] is True  # the train loader is the engine's TensorBatches
    # pydoc's text differs a little between Python versions: ~6400 training sequences, 5% val and test.
    split = re.search(r"data CharCorpus: (\d+) train, (\d+) val, (\d+) test sequences of 65 characters",
                      (char_lm_run / "train.log").read_text())  # fmt: skip
    train, val, test = map(int, split.groups())
    assert val == test == int((train + val + test) * 0.05) and train > 6000


def test_eval_of_the_best_checkpoint_reproduces_the_test_metrics(char_lm_run):
    trained = summary(char_lm_run)
    log_dir = char_lm_run.parents[2]
    best = trained["checkpoints"]["best"]
    assert trained["checkpoints"]["tested"] == best
    # Quoted: the best checkpoint's name (epoch=...-step=....ckpt) holds '=', which Hydra's override
    # syntax reads as a second assignment otherwise.
    ok(litlab("litlab-eval", f"ckpt_path='{best}'", env=env_for(log_dir)))
    (evaluation,) = run_dirs(log_dir, "eval")
    metrics = json.loads((evaluation / "eval.json").read_text())["metrics"]
    for name in ("test/loss", "test/perplexity"):
        assert abs(metrics[name] - trained["metrics"][name]) <= 1e-6 * trained["metrics"][name], name


def test_sigkill_then_the_same_command_ends_bitwise_equal_to_the_uninterrupted_run(char_lm_run, tmp_path):
    # Killed by its own tests.faults.SignalAt right after a seeded, printed step's update; from step 3
    # on, so that a checkpoint (step 2's) is there to resume from.
    log_dir = tmp_path / "logs"
    stop = Stop("SIGKILL", "train_batch_end", random_step(low=3, high=TOTAL_STEPS - 1))
    where = f"{stop} (TEST_SEED={TEST_SEED})"
    print(where)
    stop_at(stop, log_dir, *CHAR_LM)
    result = ok(litlab("litlab-train", *HOOKED, *CHAR_LM, env=env_for(log_dir)))
    _, _, resumed_step = resumed_from(result.stdout)
    assert resumed_step == stop.newest_checkpoint_step(), f"{where}: resumed from step {resumed_step}"
    expected = final_state(local_last_checkpoint(char_lm_run.parents[2]))
    assert "rng" in expected
    assert_same_tensors(expected, final_state(local_last_checkpoint(log_dir)), where)


def test_precision_accumulation_sweep_reports_tokens_per_second_and_ranks_by_lowest_val_loss(tmp_path):
    _, sweep_dir = sweep(
        tmp_path,
        "experiment=char_lm",
        "sweep=precision_accumulation",
        # Two fp32 jobs: two val losses to rank (the report's precision axis: test_sweeps.py).
        "precision=fp32",
        "trainer.accumulate_grad_batches=1,2",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=12",  # 6 optimizer steps at accumulation 2: 1 timed after 5 warm-up
        "trainer.limit_val_batches=2",
        "trainer.num_sanity_val_steps=0",
        "test_after_fit=false",
        "logger=none",
    )
    runs = summaries(sweep_dir)
    assert len(runs) == 2 and {run["status"] for run in runs} == {"completed"}
    rows = report_rows(sweep_dir)
    assert all(float(row["tokens_per_second"]) > 0 for row in rows)
    table = (sweep_dir / "report.md").read_text()
    assert "| tokens/s |" in table and "| val/loss |" in table
    best = min(runs, key=lambda run: run["metrics"]["val/loss"])
    assert f"Lowest val/loss: {best['metrics']['val/loss']:.4f}" in table
    assert len({run["metrics"]["val/loss"] for run in runs}) > 1  # the ranking had something to choose
