"""Several devices from a notebook: ``litlab.train([... "strategy=ddp_notebook", "trainer.devices=2"])``
in a real Jupyter kernel (nbclient runs a notebook built here) forks 2 CPU ranks, and its summary.json
says what the same run under ``strategy=ddp`` (``litlab-train``, each rank a process of its own) says:
the steps, epochs, metrics, world and status. The ddp run is shared with the bf16 check below."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import TINY, litlab, ok, summary

pytestmark = pytest.mark.slow

SETTINGS = ["trainer.devices=2", "trainer.accelerator=cpu", "precision=bf16", *TINY]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """summary.json of ``litlab-train strategy=ddp`` with SETTINGS (Lightning's subprocess launcher)."""
    folder = tmp_path_factory.mktemp("ddp")
    where = [f"paths.log_dir={folder / 'logs'}", f"hydra.run.dir={folder / 'run'}"]
    ok(litlab("litlab-train", *where, "strategy=ddp", *SETTINGS, timeout=120))
    return summary(folder / "run")


def test_ddp_with_bf16_mixed_precision_trains_on_two_cpu_ranks(ddp_run):
    assert (ddp_run["status"], ddp_run["world_size"], ddp_run["precision"]["effective"]) == (
        "completed",
        2,
        "bf16-mixed",
    )


def test_ddp_notebook_in_a_jupyter_kernel_reports_what_ddp_reports(tmp_path, monkeypatch, ddp_run):
    # A kernel that runs this interpreter (the venv's), found through JUPYTER_PATH as Jupyter finds any.
    kernel = tmp_path / "jupyter" / "kernels" / "litlab-test"
    kernel.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "litlab", "language": "python"}
    (kernel / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    logs = f"paths.log_dir={tmp_path / 'logs'}"
    overrides = [logs, f"hydra.run.dir={tmp_path / 'run'}", *SETTINGS, "strategy=ddp_notebook"]
    # Then, in the same kernel, a run whose forked ranks fail: float16 weights, a nan loss at step 1.
    failing = [logs, f"hydra.run.dir={tmp_path / 'failed'}", *overrides[2:], "precision=fp16_true"]
    catch = "except litlab.errors.LitlabError as error:\n    line = str(error)\nline"
    cells = [
        f"import litlab\nsummary = litlab.train({overrides!r})\nsummary['status']",
        f"try:\n    litlab.train({failing!r})\n{catch}",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell) for cell in cells])
    NotebookClient(
        notebook, kernel_name="litlab-test", timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    returned, raised = (
        [o["data"]["text/plain"] for o in cell.outputs if o["output_type"] == "execute_result"]
        for cell in notebook.cells
    )
    assert returned == ["'completed'"]  # what litlab.train returned in the kernel
    forked = summary(tmp_path / "run")
    same = ("status", "epochs", "global_step", "world_size", "devices", "world", "precision", "resume_exact")
    assert {k: forked[k] for k in same} == {k: ddp_run[k] for k in same}
    assert forked["world"]["optimizer_steps_per_rank"] == [4, 4]
    assert forked["metrics"].keys() == ddp_run["metrics"].keys() and "test/loss" in forked["metrics"]
    for name, value in ddp_run["metrics"].items():  # the same seed, data and ranks: the same numbers
        assert forked["metrics"][name] == pytest.approx(value, rel=1e-4), name
    assert [e["step"] for e in forked["history"]] == [e["step"] for e in ddp_run["history"]]
    assert forked["throughput"]["seconds_per_epoch"] > 0 and forked["memory"]["peak_rss_mib_per_rank"]
    checkpoints = forked["checkpoints"]
    assert Path(checkpoints["last"]).name == "last.ckpt" and checkpoints["tested"] == checkpoints["best"]

    # The failed run: the line names the rank and why, and so does summary.json, which claims no
    # progress it did not see (the steps ended with the ranks).
    (line,) = raised
    assert "litlab: error: rank " in line and "at global step 1" in line and "the loss is nan" in line, line
    failed = summary(tmp_path / "failed")
    assert (failed["status"], failed["global_step"], failed["epochs"]) == ("failed", None, None)
    assert failed["error"] in line
    assert not list((tmp_path / "logs").rglob("*.lock"))  # both runs released their lock
