"""The version of the user's code a run records (``litlab.config.identity.code_version``), on a copy of
a tiny user package and its configs: which files count, and that an edit to one of them, and only to
them, changes the fingerprint. The end-to-end flow (a completed run, an edit, the same command) runs
in-process on the example task."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import litlab
from litlab.config.identity import code_version
from tests.conftest import TINY

FILES = {
    "mypkg/__init__.py": "",
    "mypkg/model.py": (
        "import torch\n\nfrom mypkg.sub.layers import WIDTH\n\n\n"
        "class Tiny:\n    def __init__(self, width: int = WIDTH):\n        self.w = width\n"
    ),
    "mypkg/sub/__init__.py": "",
    "mypkg/sub/layers.py": "from .. import helpers\n\nWIDTH = helpers.TWO\n",  # a relative import
    "mypkg/helpers.py": "TWO = 2\n",
    "mypkg/unused.py": "import mypkg.model\n",  # imports the run's code; nothing imports it
    "configs/train.yaml": (
        "defaults:\n  - model: tiny\n  - callbacks: default\n  - storage: local\n"
        "  - optional local: default\n  - _self_\nseed: 1\n"
    ),
    "configs/model/tiny.yaml": "_target_: mypkg.model.Tiny\nwidth: 3\nloss:\n  _target_: torch.nn.MSELoss\n",
    "configs/model/other.yaml": "_target_: mypkg.model.Tiny\nwidth: 5\n",
    "configs/callbacks/default.yaml": "defaults:\n  - extra\n  - _self_\nlog: true\n",
    "configs/callbacks/extra.yaml": "extra:\n  _target_: litlab.callbacks.progress.Progress\n",
    "configs/storage/local.yaml": "root: /somewhere\n",
    "configs/local/default.yaml": "seed: 2\n",
}


@pytest.fixture
def room(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's package and configs in a fresh folder, importable as a checkout's src/ is."""
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def composed(room: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(room / "configs"), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def version(room: Path, *overrides: str):
    cfg = composed(room, *overrides)
    return code_version(cfg, cfg.hydra)


def test_the_users_code_the_run_imports_and_the_config_files_that_composed_it_are_hashed(room):
    assert sorted(version(room)["files"]) == [
        "configs/callbacks/default.yaml",
        "configs/callbacks/extra.yaml",  # named by a defaults list, not a group choice
        "configs/local/default.yaml",
        "configs/model/tiny.yaml",
        "configs/train.yaml",
        "mypkg/__init__.py",
        "mypkg/helpers.py",  # imported by what the _target_'s module imports
        "mypkg/model.py",
        "mypkg/sub/__init__.py",
        "mypkg/sub/layers.py",
    ]  # not torch (installed), litlab (the engine), storage/ (where runs go), other.yaml (not chosen),
    # mypkg/unused.py (no part of the run imports it)


def test_an_edit_to_the_users_code_or_configs_changes_the_fingerprint_and_names_the_file(room):
    before = version(room)
    assert version(room) == before and version(room)["fingerprint"] == before["fingerprint"]  # stable
    for name in ("mypkg/helpers.py", "configs/model/tiny.yaml", "configs/local/default.yaml"):
        (room / name).write_text((room / name).read_text() + "# edited\n")
        after = version(room)
        assert after["fingerprint"] != before["fingerprint"], name
        assert {n for n in after["files"] if after["files"][n] != before["files"][n]} == {name}
        before = after
    (room / "mypkg" / "added.py").write_text("X = 1\n")
    (room / "mypkg" / "helpers.py").write_text("from mypkg.added import X\nTWO = 2\n")
    assert "mypkg/added.py" in version(room)["files"]


def test_files_no_part_of_the_run_imports_leave_the_fingerprint_alone(room):
    """A second task added beside the first (docs/your-task.md: its own folder), and an edit to a file
    the run does not import, leave the first task's version as it was: its completed runs stay."""
    before = version(room)
    (room / "mypkg" / "tabular").mkdir()
    (room / "mypkg" / "tabular" / "__init__.py").write_text("")
    table = "from mypkg import helpers\nfrom ..sub import layers\n"  # imports what the first task uses
    (room / "mypkg" / "tabular" / "module.py").write_text(table)
    (room / "configs" / "model" / "table.yaml").write_text("_target_: mypkg.tabular.module.Table\n")
    (room / "mypkg" / "unused.py").write_text("import mypkg.model\n# edited\n")
    assert version(room) == before
    assert "mypkg/tabular/module.py" in version(room, "model=table")["files"]


def test_files_that_did_not_compose_the_run_leave_the_fingerprint_alone(room):
    before = version(room)["fingerprint"]
    (room / "configs/model/other.yaml").write_text("_target_: mypkg.model.Tiny\nwidth: 7\n")
    (room / "configs/storage/local.yaml").write_text("root: /elsewhere\n")
    assert version(room)["fingerprint"] == before
    assert version(room, "model=other")["fingerprint"] != before  # chosen now


def test_the_fingerprint_does_not_depend_on_where_the_checkout_is(room, tmp_path_factory, monkeypatch):
    elsewhere = tmp_path_factory.mktemp("other-machine")
    for name, text in FILES.items():
        (elsewhere / name).parent.mkdir(parents=True, exist_ok=True)
        (elsewhere / name).write_text(text)
    first = version(room)["fingerprint"]
    monkeypatch.syspath_prepend(str(elsewhere))
    assert version(elsewhere)["fingerprint"] == first


def quick_run(tmp_path: Path, *overrides: str) -> list[str]:
    """A run of one batch of the MLP, stored under ``tmp_path/logs`` (its folder is Hydra's run folder)."""
    return [
        *TINY,
        f"paths.log_dir={tmp_path / 'logs'}",
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
        "logger=none",
        "model=mlp",
        "test_after_fit=false",
        *overrides,
    ]


MARKER = "from lightning.pytorch.callbacks import Callback\n\n\nclass Marker(Callback):\n    pass\n"


def test_the_same_command_after_an_edit_trains_a_new_run_and_then_skips_it(tmp_path, monkeypatch):
    """make train, edit the model, make train: the second trains (a new run of its own); a third
    with no change is the completed run, as before."""
    package = tmp_path / "room" / "mycallbacks"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(MARKER)
    monkeypatch.syspath_prepend(str(package.parent))
    train = lambda: litlab.train(quick_run(tmp_path, "+callbacks.marker._target_=mycallbacks.Marker"))  # noqa: E731
    first = train()
    assert first["status"] == "completed" and first["code_fingerprint"]
    assert (
        first["run_dir"]
        == first["storage_dir"]
        == str(tmp_path / "logs" / "train" / "runs" / first["run_name"])
    )
    (package / "__init__.py").write_text(MARKER.replace("pass", "width = 2"))
    second = train()
    # Trained in a folder of its own, which Hydra's run folder is (started_at has whole seconds: two
    # quick runs may share one).
    assert second["status"] == "completed" and second["run_dir"] == second["storage_dir"] != first["run_dir"]
    assert re.fullmatch(rf"{first['run_name']}-[0-9a-f]{{8}}", second["run_name"])
    record = json.loads(Path(second["storage_dir"], "run.json").read_text())
    assert record["code"]["fingerprint"] == second["code_fingerprint"]
    assert json.loads(Path(first["run_dir"], "summary.json").read_text()) == first  # left as it was
    third = train()
    assert third == second  # the stored summary, copied: not trained again


def test_a_sweep_starts_a_completed_job_again_once_its_code_changed(tmp_path, monkeypatch):
    """The pool's check before starting a job takes the decision the job's own process would."""
    from litlab.config.identity import run_identity
    from litlab.launch.pool import DevicePoolLauncher, task_config
    from litlab.storage import resume
    from litlab.storage.roots import RunStorage
    from tests.conftest import compose_train

    package = tmp_path / "room" / "sweepcallbacks"  # not imported yet
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(MARKER)
    monkeypatch.syspath_prepend(str(package.parent))
    root = tmp_path / "storage"
    config = compose_train(
        [f"storage.root={root}", "+callbacks.marker._target_=sweepcallbacks.Marker"], tmp_path / "job"
    )
    task_cfg = task_config(config)
    storage = RunStorage(str(root), run_identity(task_cfg))
    storage.prepare()
    code = code_version(task_cfg, config.hydra)
    resume.record_start(storage, resume.Decision(code=code), tmp_path / "job")
    storage.write_text("summary.json", json.dumps({"status": "completed", "run_name": storage.identity}))
    summary = DevicePoolLauncher._completed(task_cfg, config.hydra, run_identity(task_cfg))
    assert summary["run_name"] == storage.identity
    (package / "__init__.py").write_text(MARKER.replace("pass", "width = 2"))
    assert DevicePoolLauncher._completed(task_cfg, config.hydra, run_identity(task_cfg)) is None


def test_a_sweep_starts_a_completed_job_again_under_its_name_once_its_settings_changed(tmp_path):
    """``-m precision=fp32,bf16 'run_name=exp_${precision.name}'``, then the same with
    ``trainer.max_epochs=3``: the pool's check skips a job only where its run trained these settings."""
    from litlab.config.identity import run_settings, settings_fingerprint
    from litlab.launch.pool import DevicePoolLauncher, task_config
    from litlab.storage import resume
    from litlab.storage.roots import RunStorage
    from tests.conftest import compose_train

    root = tmp_path / "storage"
    named = [f"storage.root={root}", "run_name=exp_${precision.name}", "trainer.max_epochs=1"]
    config = compose_train(named, tmp_path / "job")
    task_cfg = task_config(config)
    storage = RunStorage(str(root), "exp_fp32")
    storage.prepare()
    code = {
        **code_version(task_cfg, config.hydra),
        "settings": settings_fingerprint(run_settings(task_cfg)),
    }
    resume.record_start(storage, resume.Decision(code=code), tmp_path / "job")
    storage.write_text("summary.json", json.dumps({"status": "completed", "run_name": "exp_fp32"}))
    assert DevicePoolLauncher._completed(task_cfg, config.hydra, "exp_fp32") is not None
    for changed in ("trainer.max_epochs=3", "trainer.accumulate_grad_batches=2"):
        config = compose_train([*named, changed], tmp_path / "job")
        task_cfg = task_config(config)
        assert DevicePoolLauncher._completed(task_cfg, config.hydra, "exp_fp32") is None, changed


def test_a_run_resumed_across_a_code_edit_is_marked_in_its_summary(tmp_path, monkeypatch):
    """A run killed after its checkpoint, the code edited, the same command: it resumes (a requeue
    never starts over) and trained partly under each version, which summary.json says."""
    package = tmp_path / "room" / "resumedcallbacks"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(MARKER)
    monkeypatch.syspath_prepend(str(package.parent))
    run = quick_run(tmp_path, "+callbacks.marker._target_=resumedcallbacks.Marker")
    first = litlab.train(run)
    assert first["resumed_across"] == []
    Path(first["storage_dir"], "summary.json").unlink()  # killed after its checkpoint: unfinished
    (package / "__init__.py").write_text(MARKER.replace("pass", "width = 2"))
    resumed = litlab.train(run)
    assert resumed["run_name"] == first["run_name"] and resumed["resumed_count"] == 1
    assert resumed["code_fingerprint"] != first["code_fingerprint"]
    assert resumed["resumed_across"] == [
        f"code {first['code_fingerprint'][:8]}→{resumed['code_fingerprint'][:8]}"
    ]


def test_a_completed_run_named_by_the_user_trains_again_when_its_settings_changed(tmp_path):
    """``run_name=exp trainer.max_epochs=1``, then the same with ``trainer.max_epochs=2`` (or another
    accumulation): a run of its own, not the one-epoch results; the same settings again find theirs."""
    run = quick_run(tmp_path, "run_name=exp", "trainer.limit_train_batches=2")
    first = litlab.train(run)
    assert first["status"] == "completed" and first["run_name"] == "exp"
    longer = litlab.train([*run, "trainer.max_epochs=2"])
    assert longer["status"] == "completed" and longer["epochs"] == 2
    assert longer["run_name"].startswith("exp-") and longer["storage_dir"] != first["storage_dir"]
    accumulated = litlab.train([*run, "trainer.accumulate_grad_batches=2"])
    assert accumulated["accumulate_grad_batches"] == 2 and accumulated["global_step"] == 1
    assert accumulated["run_name"] not in ("exp", longer["run_name"])
    assert litlab.train(run) == first  # not trained again
    assert litlab.train([*run, "trainer.max_epochs=2"]) == longer


def as_stored_by_532e9de(folder: Path, completed: bool) -> Path:
    """The run's storage folder as litlab 532e9de would have left it: named by the hash of its
    settings as spelled (0 and 0.0 apart), its code recorded as every file of the user's package.
    Returns the folder under that name."""
    import hashlib

    import project

    summary = json.loads((folder / "summary.json").read_text())
    spelled = hashlib.sha1(json.dumps(summary["settings"], sort_keys=True, default=str).encode()).hexdigest()
    package = Path(project.__file__).parent
    record = json.loads((folder / "run.json").read_text())
    files = dict(record["code"]["files"])
    for path in package.rglob("*.py"):
        digest = hashlib.sha1(path.read_bytes()).hexdigest()[:16]
        files[f"project/{path.relative_to(package).as_posix()}"] = digest
    lines = "".join(f"{name}\t{digest}\n" for name, digest in sorted(files.items()))
    fingerprint = hashlib.sha1(lines.encode()).hexdigest()
    record["code"] = {"fingerprint": fingerprint, "files": files, "settings": spelled}
    for start in record["starts"]:
        start.update(code=fingerprint, settings=spelled)
    earlier = folder.with_name(f"{summary['experiment_name']}-{spelled[:10]}")
    assert earlier != folder  # the default configs hold 0.0 (trainer.overfit_batches): every identity changed
    record["identity"] = earlier.name
    (folder / "run.json").write_text(json.dumps(record))
    if not completed:
        (folder / "summary.json").unlink()  # killed after its checkpoint
    folder.rename(earlier)
    return earlier


@pytest.mark.parametrize("completed", [True, False])
def test_a_run_stored_by_litlab_532e9de_is_skipped_completed_and_resumes_unfinished(tmp_path, completed):
    """Upgrading litlab trains no finished run again, and an unfinished one continues in its folder
    with nothing marked as changed: the identity and the code's version are computed otherwise now."""
    run = quick_run(tmp_path)
    first = litlab.train(run)
    earlier = as_stored_by_532e9de(Path(first["storage_dir"]), completed)
    again = litlab.train(run)
    assert [p.name for p in earlier.parent.iterdir()] == [earlier.name]  # no other run folder
    if completed:
        assert again == first  # the stored summary: not trained again
        return
    assert again["run_name"] == earlier.name and again["storage_dir"] == str(earlier)
    assert again["status"] == "completed" and again["resumed_count"] == 1
    assert again["resumed_across"] == []
    assert litlab.train(run) == again
