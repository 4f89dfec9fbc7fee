"""Bad input: a non-zero exit, one sentence naming the bad value and what is allowed, no traceback,
no checkpoints, and an earlier run's files left exactly as they were.

Most rows fail in preflight (well under a second, no torch); the rows marked "after torch" can only
be found once torch has loaded (no such GPU, weights of another model) and cost a Lightning start.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from litlab.config.rules import cpu_cores
from tests.conftest import BIN, REPO, TINY, litlab, ok, run_dirs, summary


@dataclass
class Case:
    command: str
    args: list[str]
    words: list[str]  # each appears in the last line of stderr
    marks: list = field(default_factory=list)


CORES = cpu_cores()

CASES = {
    # --- litlab-train: composition and schema -----------------------------------------------
    "unknown key": Case("litlab-train", ["trainer.max_epoch=3"], ["'trainer.max_epoch'", "max_epochs"]),
    "unknown key added with +": Case("litlab-train", ["+trainer.foo=3"], ["'trainer.foo'", "max_epochs"]),
    "wrong type": Case("litlab-train", ["trainer.max_epochs=abc"], ["trainer.max_epochs", "abc"]),
    "negative epochs": Case("litlab-train", ["trainer.max_epochs=-3"], ["trainer.max_epochs=-3", "positive"]),
    "zero epochs": Case("litlab-train", ["trainer.max_epochs=0"], ["trainer.max_epochs=0", "positive"]),
    "zero batch size": Case("litlab-train", ["data.batch_size=0"], ["data.batch_size=0", "positive"]),
    "zero accumulation": Case(
        "litlab-train", ["trainer.accumulate_grad_batches=0"], ["trainer.accumulate_grad_batches=0"]
    ),
    "global batch does not divide": Case(
        "litlab-train",
        ["data.global_batch_size=100", "trainer.accumulate_grad_batches=3"],
        ["data.global_batch_size=100", "3"],
    ),
    "unknown group option": Case("litlab-train", ["precision=fp61"], ["fp61", "precision", "bf16", "fp32"]),
    "experiment that does not exist": Case(
        "litlab-train", ["experiment=nope"], ["'nope'", "experiment", "digits_cnn"]
    ),
    "malformed override": Case("litlab-train", ["trainer.max_epochs=[1"], ["trainer.max_epochs=[1"]),
    "override without a key": Case("litlab-train", ["=3"], ["'=3'", "key"]),
    "unknown accelerator": Case(
        "litlab-train", ["trainer.accelerator=tpx"], ["trainer.accelerator=tpx", "cpu", "gpu"]
    ),
    "more CPU devices than cores": Case(
        "litlab-train", [f"trainer.devices={CORES + 1}"], [f"trainer.devices={CORES + 1}", f"{CORES} CPU"]
    ),
    "negative learning rate (after torch)": Case(
        "litlab-train", ["optimizer.lr=-1"], ["optimizer=adamw", "lr=-1", "Invalid learning rate"]
    ),
    "unknown key in your group": Case(
        "litlab-train", ["model.net.hiden=3"], ["'model.net.hiden'", "project.vision.nets.CNN", "channels"]
    ),
    "unknown key added to your group": Case(
        "litlab-train", ["+optimizer.lrr=3"], ["'optimizer.lrr'", "torch.optim.AdamW", "lr"]
    ),
    "unknown on_nonfinite": Case("litlab-train", ["on_nonfinite=ignore"], ["on_nonfinite=ignore", "skip"]),
    "unknown oom option": Case("litlab-train", ["oom=retry"], ["'retry'", "auto_shrink", "fail"]),
    "unknown clipping algorithm": Case(
        "litlab-train",
        ["trainer.gradient_clip_algorithm=median"],
        ["trainer.gradient_clip_algorithm=median", "norm", "value"],
    ),
    "batch-size finder on two devices": Case(
        "litlab-train",
        ["tune.batch_size=true", "trainer.devices=2"],
        ["tune.batch_size", "trainer.devices=2"],
    ),
    "image folder without a root": Case("litlab-train", ["data=image_folder"], ["data.root", "required"]),
    "metric mode that does not exist": Case(
        "litlab-train", ["optimized_metric_mode=highest"], ["optimized_metric_mode=highest", "min", "max"]
    ),
    "image folder that does not exist": Case(
        "litlab-train", ["data=image_folder", "data.root={tmp}/nowhere"], ["data.root={tmp}/nowhere"]
    ),
    "image folder without images": Case(
        "litlab-train", ["data=image_folder", "data.root={no_images}"], ["data.root={no_images}", ".png"]
    ),
    # --- litlab-train: found after torch loads ------------------------------------------------
    "more GPUs than the machine has (after torch)": Case(
        "litlab-train",
        ["trainer.accelerator=gpu", "trainer.devices=64", *TINY],
        ["trainer.accelerator=gpu", "trainer.devices=64"],
    ),
    "storage root unwritable": Case(
        "litlab-train",
        ["storage.root=/proc/litlab-storage", *TINY],
        ["/proc/litlab-storage"],
    ),
    # --- litlab-eval ----------------------------------------------------------------------------
    "eval without ckpt_path": Case("litlab-eval", [], ["ckpt_path is required", "last.ckpt"]),
    "eval ckpt_path that does not exist": Case(
        "litlab-eval", ["ckpt_path={tmp}/none.ckpt"], ["ckpt_path={tmp}/none.ckpt"]
    ),
    "eval ckpt_path that is not a checkpoint": Case(
        "litlab-eval", ["ckpt_path={text_file}"], ["ckpt_path={text_file}", "not a checkpoint", ".ckpt"]
    ),
    "eval checkpoint of another model (after torch)": Case(
        "litlab-eval", ["ckpt_path={other_model}"], ["ckpt_path={other_model}", "do not fit model=mlp"]
    ),
    # --- litlab-compare -------------------------------------------------------------------------
    "compare a missing directory": Case("litlab-compare", ["{tmp}/nowhere"], ["{tmp}/nowhere"]),
    "compare an empty directory": Case("litlab-compare", ["{empty_dir}"], ["{empty_dir}"]),
}


# Two setups that run but mislead, and must warn: DDP with one device, fp16 on a CPU (runs bf16).
MISLEADING = ["strategy=ddp", "trainer.devices=1", "precision=fp16"]


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A log folder holding one earlier, successful run (of the misleading setups, to check their
    warnings with the same process), and that run's output."""
    log_dir = tmp_path_factory.mktemp("earlier") / "logs"
    return log_dir, ok(litlab("litlab-train", *MISLEADING, *TINY, env={"LITLAB_LOG_DIR": str(log_dir)}))


@pytest.fixture
def earlier(earlier_run) -> Path:
    """The log folder of the earlier run: bad commands must leave it as it is."""
    return earlier_run[0]


class Places(dict):
    """Paths a case's arguments name, made on first use: ``{text_file}``, ``{other_model}``..."""

    def __init__(self, tmp_path: Path, log_dir: Path) -> None:
        super().__init__(tmp=str(tmp_path))
        self.tmp_path, self.log_dir = tmp_path, log_dir

    def __missing__(self, name: str) -> str:
        path = self.tmp_path / name
        if name == "text_file":
            (path := path.with_suffix(".ckpt")).write_text("not a checkpoint\n")
        elif name == "empty_dir":
            path.mkdir()
        elif name == "no_images":
            (path / "class_a").mkdir(parents=True)
            (path / "class_a" / "notes.txt").write_text("no images here\n")
        elif name == "other_model":
            path = write_checkpoint_of_another_model(self.log_dir, path.with_suffix(".ckpt"))
        self[name] = str(path)
        return self[name]


def write_checkpoint_of_another_model(log_dir: Path, path: Path) -> Path:
    """The earlier run's checkpoint, relabelled as an MLP: its CNN weights do not fit that model."""
    import torch

    (source,) = log_dir.glob("storage/*/checkpoints/last.ckpt")
    checkpoint = torch.load(source, map_location="cpu", weights_only=True)
    stored = checkpoint["litlab"]
    net = {"_target_": "project.vision.nets.MLP", "_partial_": True, "hidden_sizes": [16], "dropout": 0.0}
    stored["config"]["model"] = {**stored["config"]["model"], "net": net}
    stored["choices"]["model"] = "mlp"
    torch.save(checkpoint, path)
    return path


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root, following links (checkpoints/ is a link into storage/)."""
    hashes = {}
    for folder, _, names in os.walk(root, followlinks=True):
        for name in names:
            path = Path(folder, name)
            hashes[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=case.marks, id=name) for name, case in CASES.items()]
)
def test_bad_input_fails_in_one_sentence_and_harms_nothing(name: str, earlier: Path, tmp_path: Path):
    case, places = CASES[name], Places(tmp_path, earlier)
    args = [arg.format_map(places) for arg in case.args]
    before = file_hashes(earlier)

    result = litlab(case.command, *args, env={"LITLAB_LOG_DIR": str(earlier)})

    assert result.returncode != 0, result.stdout[-2000:]
    last_line = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    for word in case.words:
        assert word.format_map(places) in last_line, result.stderr[-3000:]
    if case.command != "litlab-compare":  # compare's wording is its own
        assert last_line.startswith("litlab: error: "), result.stderr[-3000:]
    assert not re.search(r"[.!?] +[A-Z]", last_line), f"more than one sentence: {last_line}"
    assert "Traceback" not in result.stderr + result.stdout
    after = file_hashes(earlier)
    assert {k: v for k, v in after.items() if k in before} == before, "an earlier run's file changed"
    assert [k for k in after if k.endswith(".ckpt")] == [k for k in before if k.endswith(".ckpt")]


def test_hydra_full_error_shows_the_traceback(log_dir):
    # The one-line form is for people; HYDRA_FULL_ERROR=1 is how a developer asks for the stack.
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    result = subprocess.run(
        [str(BIN / "litlab-train"), "trainer.max_epoch=3"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "trainer.max_epoch" in result.stderr


def test_bad_config_does_not_import_torch(log_dir):
    # -X importtime lists every module imported; validation must stay torch-free to fail fast.
    code = "import sys; sys.argv=['litlab-train','precision=fp61']; from litlab.cli.train import main; main()"
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
    assert result.returncode == 2
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "hydra" in imported
    assert "torch" not in imported and "lightning" not in imported
    assert not log_dir.exists() or not run_dirs(log_dir)


# --- setups that run, with a warning --------------------------------------------------------


def test_setups_that_run_but_mislead_warn_and_record_what_ran(earlier_run):
    log_dir, result = earlier_run
    run = run_dirs(log_dir)[0]  # the first run in this folder; bad-input cases may add failed ones
    outcome = summary(run)
    assert outcome["overrides"][: len(MISLEADING)] == MISLEADING
    assert (outcome["world_size"], outcome["strategy"]) == (1, "ddp")
    assert outcome["precision"] == {"requested": "16-mixed", "effective": "bf16-mixed"}
    warnings = [line for line in result.stdout.splitlines() if "WARNING" in line]
    ddp = [line for line in warnings if "strategy=ddp" in line]
    assert ddp and "one process" in ddp[0], result.stdout[-3000:]
    precision = [line for line in warnings if "requested 16-mixed" in line]
    assert precision and "bf16-mixed" in precision[0]
