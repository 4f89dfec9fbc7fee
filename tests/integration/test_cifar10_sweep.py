"""``sweep=precision_accumulation`` on ``data=cifar10`` (a small archive the test writes): real jobs
(the precision axis; accumulation is the same for every dataset and tests/integration/test_sweeps.py
sweeps it), and a report with the seconds each run took to reach its baseline's final accuracy."""

from __future__ import annotations

import csv
import json

from tests.cifar_files import write_cifar10
from tests.conftest import litlab, ok


def test_the_precision_accumulation_sweep_runs_on_cifar10_and_reports_time_to_target(log_dir, tmp_path):
    root = write_cifar10(tmp_path / "data", images_per_batch=16)  # 72 train, 8 val, 16 test images
    ok(
        litlab(
            "litlab-train",
            "sweep=precision_accumulation",
            "trainer.accumulate_grad_batches=1",  # replaces that axis of the sweep file
            "data=cifar10",
            f"data.root={root}",
            "data.batch_size=8",
            "model=cnn",
            "model.net.channels=[8,16]",
            "trainer.max_epochs=2",
            "trainer.num_sanity_val_steps=0",
            "trainer.enable_model_summary=false",
            "logger=csv",
            timeout=600,
        )
    )
    (sweep,) = (log_dir / "train" / "multiruns").iterdir()
    with (sweep / "report.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [(row["precision"], row["status"]) for row in rows] == [
        ("fp32", "completed"),
        ("fp16", "completed"),
        ("bf16", "completed"),
    ]
    for row in rows:
        summary = json.loads((sweep / row["run"].lstrip("#") / "summary.json").read_text())
        assert summary["groups"]["data"] == "cifar10" and len(summary["history"]) == 2
        curve = [entry["metrics"]["val/acc"] for entry in summary["history"]]
        baseline_final = float(next(r for r in rows if r["is_baseline"] == "True")["val/acc"])
        reached = [
            e["wall_s"] for e, value in zip(summary["history"], curve, strict=True) if value >= baseline_final
        ]
        assert row["seconds_to_baseline_val/acc"] == (str(reached[0]) if reached else "never")
    assert (sweep / "report.png").stat().st_size > 0
