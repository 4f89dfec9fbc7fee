"""The version of the user's code a run records (``litlab.config.identity.code_version``), on a copy of
a tiny user package and its configs: which files count, and that an edit to one of them, and only to
them, changes the fingerprint. The end-to-end flow (a completed run, an edit, the same command) runs
in-process on the example task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import litlab
from litlab.config.identity import code_version
from tests.conftest import TINY

FILES = {
    "mypkg/__init__.py": "",
    "mypkg/model.py": "class Tiny:\n    def __init__(self, width: int = 2):\n        self.w = width\n",
    "mypkg/sub/__init__.py": "",
    "mypkg/sub/layers.py": "WIDTH = 2\n",
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


def test_the_users_package_and_the_config_files_that_composed_the_run_are_hashed(room):
    assert sorted(version(room).files) == [
        "configs/callbacks/default.yaml",
        "configs/callbacks/extra.yaml",  # named by a defaults list, not a group choice
        "configs/local/default.yaml",
        "configs/model/tiny.yaml",
        "configs/train.yaml",
        "mypkg/__init__.py",
        "mypkg/model.py",
        "mypkg/sub/__init__.py",
        "mypkg/sub/layers.py",
    ]  # not torch (installed), litlab (the engine), storage/ (where runs go), other.yaml (not chosen)


def test_an_edit_to_the_users_code_or_configs_changes_the_fingerprint_and_names_the_file(room):
    before = version(room)
    assert version(room) == before and version(room).fingerprint == before.fingerprint  # stable
    for name in ("mypkg/sub/layers.py", "configs/model/tiny.yaml", "configs/local/default.yaml"):
        (room / name).write_text((room / name).read_text() + "# edited\n")
        after = version(room)
        assert after.fingerprint != before.fingerprint, name
        assert {n for n in after.files if after.files[n] != before.files[n]} == {name}
        before = after
    (room / "mypkg" / "added.py").write_text("X = 1\n")
    assert "mypkg/added.py" in version(room).files


def test_files_that_did_not_compose_the_run_leave_the_fingerprint_alone(room):
    before = version(room).fingerprint
    (room / "configs/model/other.yaml").write_text("_target_: mypkg.model.Tiny\nwidth: 7\n")
    (room / "configs/storage/local.yaml").write_text("root: /elsewhere\n")
    assert version(room).fingerprint == before
    assert version(room, "model=other").fingerprint != before  # chosen now


def test_the_fingerprint_does_not_depend_on_where_the_checkout_is(room, tmp_path_factory, monkeypatch):
    elsewhere = tmp_path_factory.mktemp("other-machine")
    for name, text in FILES.items():
        (elsewhere / name).parent.mkdir(parents=True, exist_ok=True)
        (elsewhere / name).write_text(text)
    first = version(room).fingerprint
    monkeypatch.syspath_prepend(str(elsewhere))
    assert version(elsewhere).fingerprint == first


MARKER = "from lightning.pytorch.callbacks import Callback\n\n\nclass Marker(Callback):\n    pass\n"


def test_the_same_command_after_an_edit_trains_a_new_run_and_then_skips_it(tmp_path, monkeypatch):
    """make train, edit the model, make train: the second trains (a new run of its own); a third
    with no change is the completed run, as before."""
    package = tmp_path / "room" / "mycallbacks"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(MARKER)
    monkeypatch.syspath_prepend(str(package.parent))
    run = [
        *TINY,
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
        "logger=none",
        "model=mlp",
        "test_after_fit=false",
        "+callbacks.marker._target_=mycallbacks.Marker",
    ]
    train = lambda: litlab.train([f"paths.log_dir={tmp_path / 'logs'}", *run])  # noqa: E731  (Hydra's run folder)
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
    assert second["run_name"] == f"{first['run_name']}-{second['code_fingerprint'][:8]}"
    record = json.loads(Path(second["storage_dir"], "run.json").read_text())
    assert record["code"]["fingerprint"] == second["code_fingerprint"]
    assert json.loads(Path(first["run_dir"], "summary.json").read_text()) == first  # left as it was
    third = train()
    assert third == second  # the stored summary, copied: not trained again


def test_a_sweep_starts_a_completed_job_again_once_its_code_changed(tmp_path, monkeypatch):
    """The pool's check before starting a job takes the decision the job's own process would."""
    from litlab.config.identity import run_identity
    from litlab.launch.pool import DevicePoolLauncher
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
    task_cfg = DevicePoolLauncher._task_config(config)
    storage = RunStorage(str(root), run_identity(task_cfg))
    storage.prepare()
    code = code_version(task_cfg, config.hydra).record()
    resume.record_start(storage, resume.Decision(code=code), tmp_path / "job")
    storage.write_text("summary.json", json.dumps({"status": "completed", "run_name": storage.identity}))
    summary = DevicePoolLauncher._completed(task_cfg, config.hydra, run_identity(task_cfg))
    assert summary["run_name"] == storage.identity
    (package / "__init__.py").write_text(MARKER.replace("pass", "width = 2"))
    assert DevicePoolLauncher._completed(task_cfg, config.hydra, run_identity(task_cfg)) is None


def test_a_run_resumed_across_a_code_edit_is_marked_in_its_summary(tmp_path, monkeypatch):
    """A run killed after its checkpoint, the code edited, the same command: it resumes (a requeue
    never starts over) and trained partly under each version, which summary.json says."""
    package = tmp_path / "room" / "resumedcallbacks"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(MARKER)
    monkeypatch.syspath_prepend(str(package.parent))
    run = [
        *TINY,
        f"paths.log_dir={tmp_path / 'logs'}",
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
        "logger=none",
        "model=mlp",
        "test_after_fit=false",
        "+callbacks.marker._target_=resumedcallbacks.Marker",
    ]
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
