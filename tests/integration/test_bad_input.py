"""Bad input: exit 2, a last line ``litlab: error: <one sentence>`` naming the bad value and what is
allowed, no traceback, and nothing made or changed: no run directory, no file anywhere under the log
folder (storage root included) or next to the command, an earlier run's files exactly as they were.

Most rows fail in preflight without importing torch: those run one after another in one process
(``tests.cli_rows`` calls each console script's ``main`` as the script does, and reports its exit
status, stderr, whether torch or Lightning are in ``sys.modules`` after it, and the files after it),
so a row that imports torch or writes a file is caught exactly, at one set of imports for all. The
rows with ``before_torch=False`` can only be found once torch has loaded (no such GPU, weights of
another model, your data module's own checks): each is a litlab process of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cli_rows import tree
from tests.conftest import BIN, FAULTS_IMPORTABLE, REPO, TINY, litlab, ok, run_dirs, summary


@dataclass
class Case:
    command: str
    args: list[str]
    words: list[str]  # each appears in the last line of stderr
    code: int = 2  # bad input; 1 is for a run that failed
    before_torch: bool = True  # found by the preflight's torch-free checks
    marks: list = field(default_factory=list)


# The cores this process may use, as coreutils counts them (not the engine's own helper); nproc
# would print OMP_NUM_THREADS instead, which tests/conftest.py sets for the tests' torch processes.
_NO_OMP = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
CORES = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True, env=_NO_OMP).stdout)

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
        ["global_batch_size=100", "trainer.accumulate_grad_batches=3"],
        ["global_batch_size=100", "3"],
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
        "litlab-train",
        ["optimizer.lr=-1"],
        ["optimizer=adamw", "lr=-1", "Invalid learning rate"],
        before_torch=False,
    ),
    "unknown key in your group": Case(
        "litlab-train", ["model.net.hiden=3"], ["'model.net.hiden'", "project.vision.nets.CNN", "channels"]
    ),
    # A sweep (-m): the single run's line, before any job starts, and no sweep folder.
    "unknown key in a sweep": Case(
        "litlab-train",
        ["-m", "seed=1,2", "model.net.hiden=3"],
        ["'model.net.hiden'", "project.vision.nets.CNN", "channels"],
    ),
    "bad value in a sweep": Case(
        "litlab-train", ["-m", "seed=1,2", "compile=null"], ["'compile'", "not Optional"]
    ),
    # A metric the module's source never logs: said once, before any job trains to its first validation.
    "metric the module never logs, in a sweep": Case(
        "litlab-train",
        ["-m", "seed=1,2", "optimized_metric=val/accuracy"],
        ["optimized_metric=val/accuracy is logged nowhere", "{{split}}/acc"],
    ),
    "unknown key in every job of a sweep": Case(
        "litlab-train",
        ["-m", "precision=fp32,bf16", "trainer.max_epoch=1"],
        ["'trainer.max_epoch'", "max_epochs"],
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
    # Found by your data module when the run builds it (after torch).
    "image folder that does not exist": Case(
        "litlab-train",
        ["data=image_folder", "data.root={tmp}/nowhere"],
        ["data.root={tmp}/nowhere"],
        before_torch=False,
    ),
    "image folder without images": Case(
        "litlab-train",
        ["data=image_folder", "data.root={no_images}"],
        ["data.root={no_images}", ".png"],
        before_torch=False,
    ),
    # --- litlab-train: found after torch loads ------------------------------------------------
    "more GPUs than the machine has (after torch)": Case(
        "litlab-train",
        ["trainer.accelerator=gpu", "trainer.devices=64", *TINY],
        ["trainer.accelerator=gpu", "trainer.devices=64"],
        before_torch=False,
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
        "litlab-eval",
        ["ckpt_path={other_model}"],
        ["ckpt_path={other_model}", "do not fit model=mlp"],
        before_torch=False,
    ),
    # --- litlab-predict (after torch): nothing to call, or data of another task ---------------------
    "predict through a forward that refuses (x, y) batches (after torch)": Case(
        "litlab-predict",
        ["ckpt_path={without_predict_step}"],
        ["ClassifierWithoutPredictStep has no predict_step", "(here a tuple of 2)", "def predict_step"],
        before_torch=False,
    ),
    "predict a checkpoint on another task's data (after torch)": Case(
        "litlab-predict",
        ["ckpt_path={earlier_checkpoint}", "data=pydoc_topics"],
        ["data=pydoc_topics does not fit model=cnn", "trained on data=digits", "'CharCorpus'"],
        before_torch=False,
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
        elif name == "earlier_checkpoint":
            (path,) = self.log_dir.glob("train/runs/*/checkpoints/last.ckpt")
        elif name == "without_predict_step":
            path = write_checkpoint_of_another_model(
                self.log_dir,
                path.with_suffix(".ckpt"),
                {"_target_": "tests.faults.ClassifierWithoutPredictStep"},
            )
        self[name] = str(path)
        return self[name]


def write_checkpoint_of_another_model(log_dir: Path, path: Path, model: dict | None = None) -> Path:
    """The earlier run's checkpoint, relabelled as an MLP (its CNN weights do not fit that model), or
    with ``model`` changed in its config."""
    import torch

    (source,) = log_dir.glob("train/runs/*/checkpoints/last.ckpt")
    checkpoint = torch.load(source, map_location="cpu", weights_only=True)
    stored = checkpoint["litlab"]
    net = {"_target_": "project.vision.nets.MLP", "_partial_": True, "hidden_sizes": [16], "dropout": 0.0}
    stored["config"]["model"] = {**stored["config"]["model"], **(model or {"net": net})}
    stored["choices"]["model"] = stored["choices"]["model"] if model else "mlp"
    torch.save(checkpoint, path)
    return path


ERROR_PREFIX = dict.fromkeys(
    ["litlab-train", "litlab-eval", "litlab-predict", "litlab-compare"], "litlab: error: "
)


PREFLIGHT_ROWS = [name for name, case in CASES.items() if case.before_torch]


@pytest.fixture(scope="module")
def preflight_rows(earlier_run, tmp_path_factory) -> dict[str, dict]:
    """The rows that fail before torch, run one after another in one process (tests.cli_rows): for
    each, its exit status, stderr, whether torch was imported by then, and the files under the log
    folder and the rows' folders before and after it."""
    earlier = earlier_run[0]
    rows_dir = tmp_path_factory.mktemp("rows")
    rows, words = [], []
    for index, name in enumerate(PREFLIGHT_ROWS):
        row_dir = rows_dir / f"row{index}"
        (row_dir / "workdir").mkdir(parents=True)  # the row's working directory
        places = Places(row_dir, earlier)
        rows.append({"argv": [CASES[name].command, *(a.format_map(places) for a in CASES[name].args)],
                     "cwd": str(row_dir / "workdir")})  # fmt: skip
        words.append([word.format_map(places) for word in CASES[name].words])
    request = {"rows": rows, "watch": [str(earlier), str(rows_dir)]}
    env = {**os.environ, **FAULTS_IMPORTABLE, "LITLAB_LOG_DIR": str(earlier)}
    env.pop("HYDRA_FULL_ERROR", None)
    child = subprocess.run(
        [sys.executable, "-m", "tests.cli_rows"],
        input=json.dumps(request), capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    reply = json.loads(child.stdout)
    files_before = [reply["before"], *(result["files"] for result in reply["results"])]
    for index, result in enumerate(reply["results"]):
        result.update(before=files_before[index], words=words[index])
    return dict(zip(PREFLIGHT_ROWS, reply["results"], strict=True))


def assert_fails_in_one_sentence(case: Case, code: int, stderr: str, words: list[str], shown: str) -> None:
    lines = stderr.strip().splitlines()
    last_line = lines[-1] if lines else ""
    assert code == case.code, f"exit {code}, expected {case.code}\n{shown}"
    assert last_line.startswith(ERROR_PREFIX[case.command]), shown
    for word in words:
        assert word in last_line, shown
    assert not re.search(r"[.!?] +[A-Z]", last_line), f"more than one sentence: {last_line}"
    assert "Traceback" not in shown


@pytest.mark.parametrize("name", PREFLIGHT_ROWS)
def test_bad_input_found_before_torch_fails_in_one_sentence_and_harms_nothing(name: str, preflight_rows):
    case, result = CASES[name], preflight_rows[name]
    assert_fails_in_one_sentence(case, result["code"], result["stderr"], result["words"], result["stderr"])
    # No run directory, checkpoint or any other file made or changed under the log folder (the
    # storage root is in it) or in the row's own folder (its working directory and the paths it names).
    assert result["files"] == result["before"], "files changed"
    assert result["heavy"] == [], f"{name} imported {result['heavy']} before failing"


AFTER_TORCH_ROWS = [name for name, case in CASES.items() if not case.before_torch]


@pytest.mark.parametrize("name", AFTER_TORCH_ROWS)
def test_bad_input_found_after_torch_fails_in_one_sentence_and_harms_nothing(name, earlier, tmp_path):
    case, places = CASES[name], Places(tmp_path, earlier)
    args = [arg.format_map(places) for arg in case.args]
    words = [word.format_map(places) for word in case.words]
    workdir = tmp_path / "workdir"  # the command's working directory: nothing may appear there either
    workdir.mkdir()
    before = {"logs": tree(earlier), "tmp": tree(tmp_path)}

    result = litlab(
        case.command, *args, env={**FAULTS_IMPORTABLE, "LITLAB_LOG_DIR": str(earlier)}, cwd=workdir
    )

    shown = result.stderr[-3000:] + "\n" + result.stdout[-1500:]
    assert_fails_in_one_sentence(case, result.returncode, result.stderr, words, shown)
    assert tree(earlier) == before["logs"], "the log folder changed"
    assert tree(tmp_path) == before["tmp"], "a file appeared or changed next to the command"


def test_hydra_full_error_shows_the_traceback(log_dir):
    # The one-line form is for people; HYDRA_FULL_ERROR=1 is how a developer asks for the stack.
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    result = subprocess.run(
        [str(BIN / "litlab-train"), "trainer.max_epoch=3"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert result.returncode == 1, result.stderr[-2000:]  # Hydra's own exit for an exception
    assert "Traceback" in result.stderr and "trainer.max_epoch" in result.stderr


# --- setups that run, with a warning --------------------------------------------------------


def test_setups_that_run_but_mislead_warn_and_record_what_ran(earlier_run):
    log_dir, result = earlier_run
    (run,) = run_dirs(log_dir)  # the only run: the bad-input rows that ran before it added none
    outcome = summary(run)
    assert outcome["overrides"][: len(MISLEADING)] == MISLEADING
    assert (outcome["world_size"], outcome["strategy"]) == (1, "ddp")
    assert outcome["precision"] == {"requested": "16-mixed", "effective": "bf16-mixed"}
    warnings = [line for line in result.stdout.splitlines() if "WARNING" in line]
    ddp = [line for line in warnings if "strategy=ddp" in line]
    assert ddp and "one process" in ddp[0], result.stdout[-3000:]
    precision = [line for line in warnings if "requested 16-mixed" in line]
    assert precision and "bf16-mixed" in precision[0]
