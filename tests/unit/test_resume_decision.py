"""The resume decision (``litlab.storage.resume``) on a local storage root with real checkpoint files:
which checkpoint a start continues from, when it starts fresh, and that every rank reaches rank 0's
decision on its own."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from litlab.storage import resume
from litlab.storage.resume import Decision, InvalidCheckpoint, ResumePoint
from litlab.storage.roots import RunStorage


@pytest.fixture
def storage(tmp_path) -> RunStorage:
    storage = RunStorage(str(tmp_path / "root"), "default-0123456789")
    storage.prepare()
    return storage


def save_checkpoint(storage: RunStorage, name: str, step: int, epoch: int = 0, age_s: float = 0) -> str:
    """A Lightning-shaped checkpoint (the keys resume checks), modified ``age_s`` seconds ago."""
    path = Path(storage.path) / "checkpoints" / name
    torch.save({"state_dict": {"w": torch.ones(2)}, "loops": {}, "global_step": step, "epoch": epoch}, path)
    mtime = 1_700_000_000 - age_s
    os.utime(path, (mtime, mtime))
    return str(path)


def test_a_fresh_run_has_nothing_to_resume(storage):
    decision = resume.decide("auto", storage, is_global_zero=True)
    assert decision == Decision()


def test_the_newest_valid_checkpoint_is_resumed_and_broken_newer_ones_are_skipped(storage, caplog):
    save_checkpoint(storage, "epoch=0-step=4.ckpt", step=4, age_s=30)
    middle = save_checkpoint(storage, "epoch=1-step=8.ckpt", step=8, epoch=1, age_s=20)
    broken = Path(storage.path) / "checkpoints" / "last.ckpt"
    broken.write_bytes(b"PK\x03\x04 truncated")
    with caplog.at_level(logging.INFO, logger="litlab"):
        decision = resume.decide("auto", storage, is_global_zero=True)
    assert decision.point == ResumePoint(url=middle, epoch=1, global_step=8)
    assert decision.resumed_count == 1
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"resume: skipping {broken}, it cannot be loaded (RuntimeError: ")
    # The line the resume tests read from a run's output to learn where it resumed.
    assert (
        caplog.records[-1].getMessage()
        == f"resuming from {middle} (epoch 1, step 8); resumed 0 time(s) before"
    )


def test_a_dict_without_lightning_keys_is_not_a_checkpoint(storage):
    path = Path(storage.path) / "checkpoints" / "last.ckpt"
    torch.save({"state_dict": {}}, path)
    with pytest.raises(InvalidCheckpoint, match="not a Lightning training checkpoint"):
        resume.load_point(str(path))


def test_a_checkpoint_without_an_epoch_resumes_at_epoch_zero(storage):
    path = Path(storage.path) / "checkpoints" / "last.ckpt"
    torch.save({"state_dict": {}, "loops": {}, "global_step": 3}, path)
    assert resume.load_point(str(path)) == ResumePoint(url=str(path), epoch=0, global_step=3)


def test_a_damaged_tensor_record_is_named_in_one_line_when_lightning_reads_it(storage):
    """The decision reads a checkpoint's directory and pickle only (Lightning reads the tensors once):
    a damaged tensor record passes it, and stops the run in one line naming the file when read."""
    import zipfile

    from litlab.storage.checkpoints import AtomicCheckpointIO, DamagedCheckpoint

    url = save_checkpoint(storage, "last.ckpt", step=4)
    (record,) = [r for r in zipfile.ZipFile(url).infolist() if r.filename.endswith("data/0")]
    damaged = bytearray(Path(url).read_bytes())
    damaged[record.header_offset : record.header_offset + 30] = bytes(30)
    Path(url).write_bytes(damaged)
    assert resume.decide("auto", storage, is_global_zero=True).point.url == url
    with pytest.raises(DamagedCheckpoint, match=f"checkpoint {url} is damaged .*: move it aside"):
        AtomicCheckpointIO().load_checkpoint(url, weights_only=True)


def test_a_preemption_checkpoint_wins_a_tie_with_last(storage):
    save_checkpoint(storage, "last.ckpt", step=6)
    preempted = save_checkpoint(storage, "preempted.ckpt", step=7)
    assert resume.decide("auto", storage, is_global_zero=True).point.url == preempted


def test_when_no_checkpoint_loads_the_run_starts_fresh_and_the_files_are_moved_aside(storage, caplog):
    (Path(storage.path) / "checkpoints" / "last.ckpt").write_bytes(b"not a zip")
    with caplog.at_level(logging.WARNING, logger="litlab"):
        decision = resume.decide("auto", storage, is_global_zero=True)
    assert decision == Decision()
    assert not resume.has_files(storage) and not (Path(storage.path) / "checkpoints").exists()
    (aside,) = Path(storage.root).glob("default-0123456789.replaced-*")
    assert (aside / "checkpoints" / "last.ckpt").read_bytes() == b"not a zip"
    assert "starting fresh" in caplog.text


def test_a_rank_that_does_not_act_moves_nothing(storage):
    (Path(storage.path) / "checkpoints" / "last.ckpt").write_bytes(b"not a zip")
    leftover = Path(storage.path) / "checkpoints" / ".last.ckpt.abc.tmp"
    leftover.write_bytes(b"half")
    assert resume.decide("auto", storage, is_global_zero=False) == Decision()
    assert leftover.exists() and (Path(storage.path) / "checkpoints" / "last.ckpt").exists()


def test_leftovers_of_an_interrupted_write_are_removed_before_resuming(storage):
    save_checkpoint(storage, "last.ckpt", step=5)
    leftover = Path(storage.path) / "checkpoints" / ".last.ckpt.abc.tmp"
    leftover.write_bytes(b"half")
    assert resume.decide("auto", storage, is_global_zero=True).point.global_step == 5
    assert not leftover.exists()


def test_a_completed_run_is_not_trained_again(storage):
    save_checkpoint(storage, "last.ckpt", step=9)
    storage.write_text("summary.json", json.dumps({"status": "completed", "epochs": 3, "global_step": 9}))
    decision = resume.decide("auto", storage, is_global_zero=True)
    assert decision.point is None
    assert decision.completed_summary["global_step"] == 9
    assert resume.completed_message(storage, decision.completed_summary) == (
        f"run default-0123456789 already completed (3 epochs, 9 steps, summary: "
        f"{storage.url_of('summary.json')}); not training it again. To train it from scratch: resume=never "
        "(the finished run's files are moved aside) or another run_name; to train it further: "
        "resume=<checkpoint> with a larger trainer.max_epochs"
    )


def test_an_unfinished_summary_does_not_stop_the_resume(storage):
    save_checkpoint(storage, "last.ckpt", step=9)
    storage.write_text("summary.json", json.dumps({"status": "failed"}))
    assert resume.decide("auto", storage, is_global_zero=True).point.global_step == 9


def test_resume_never_starts_fresh_and_moves_the_earlier_files_aside(storage):
    save_checkpoint(storage, "last.ckpt", step=9)
    storage.write_text("summary.json", json.dumps({"status": "completed"}))
    # Hydra's record of the start under way, in the run's folder (local storage): it stays.
    folder = Path(storage.path)
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (folder / "train.log").write_text("the first start\nthis start\n")
    assert resume.decide("never", storage, is_global_zero=True) == Decision()
    assert sorted(p.name for p in folder.iterdir()) == [".hydra", "train.log"]
    assert not resume.has_files(storage)  # what is left is not the run's
    (aside,) = Path(storage.root).glob("default-0123456789.replaced-*")
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoints", "summary.json", "train.log"]
    assert (aside / "checkpoints" / "last.ckpt").is_file()
    assert (aside / "train.log").read_text() == (folder / "train.log").read_text()  # the earlier run's log


def test_resume_never_on_an_empty_folder_moves_nothing(storage):
    assert resume.decide("never", storage, is_global_zero=True) == Decision()
    assert Path(storage.path).is_dir()
    assert not list(Path(storage.root).glob("*.replaced-*"))


def test_resume_never_in_a_sweep_job_keeps_the_jobs_own_command_and_output(storage):
    # A sweep job's first start: the sweep wrote its command.sh and opened its output.log first.
    folder = Path(storage.path)
    (folder / "command.sh").write_text("#!/bin/sh\nlitlab-train resume=never\n")
    (folder / "output.log").write_text("this start\n")
    (folder / ".hydra").mkdir()
    assert not resume.has_files(storage)
    assert resume.decide("never", storage, is_global_zero=True) == Decision()
    assert not list(Path(storage.root).glob("*.replaced-*"))  # nothing of a run was here
    # A later start with resume=never: the earlier run goes aside with a copy of the output so far.
    save_checkpoint(storage, "last.ckpt", step=9)
    resume.decide("never", storage, is_global_zero=True)
    assert sorted(p.name for p in folder.iterdir()) == [".hydra", "command.sh", "output.log"]
    (aside,) = Path(storage.root).glob("default-0123456789.replaced-*")
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoints", "output.log"]


def test_an_explicit_checkpoint_is_resumed_even_when_the_run_completed(storage, tmp_path):
    storage.write_text("summary.json", json.dumps({"status": "completed"}))
    chosen = tmp_path / "chosen.ckpt"
    torch.save({"state_dict": {}, "loops": {}, "global_step": 2, "epoch": 1}, chosen)
    decision = resume.decide(str(chosen), storage, is_global_zero=True)
    assert decision.point == ResumePoint(url=str(chosen), epoch=1, global_step=2)


def test_an_explicit_checkpoint_that_does_not_load_is_an_error_naming_it(storage, tmp_path):
    chosen = tmp_path / "chosen.ckpt"
    chosen.write_bytes(b"garbage")
    with pytest.raises(InvalidCheckpoint, match=f"resume={chosen} cannot be resumed from: "):
        resume.decide(str(chosen), storage, is_global_zero=True)


def test_the_resume_count_and_tensorboard_dir_carry_over_from_run_json(storage, tmp_path):
    save_checkpoint(storage, "last.ckpt", step=4)
    storage.write_text("run.json", json.dumps({"resumed_count": 2, "tensorboard_dir": str(tmp_path / "tb")}))
    decision = resume.decide("auto", storage, is_global_zero=True)
    assert decision.resumed_count == 3
    assert decision.tensorboard_dir == tmp_path / "tb"


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_an_unreadable_run_json_counts_as_none(storage, text):
    save_checkpoint(storage, "last.ckpt", step=4)
    storage.write_text("run.json", text)
    decision = resume.decide("auto", storage, is_global_zero=True)
    assert decision.resumed_count == 1 and decision.tensorboard_dir is None


def test_other_ranks_reach_rank_zeros_decision_after_rank_zero_acted(storage, tmp_path):
    # torchrun and Slurm start every rank at once; Lightning starts ranks 1.. once rank 0 prepared
    # the run. Each decides for itself: what rank 0 changes never changes the answer.
    url = save_checkpoint(storage, "last.ckpt", step=4, age_s=10)
    (Path(storage.path) / "checkpoints" / "newer.ckpt").write_bytes(b"not a zip")  # skipped by all
    (Path(storage.path) / "checkpoints" / ".last.ckpt.abc.tmp").write_bytes(b"half")
    storage.write_text("run.json", json.dumps({"resumed_count": 1}))
    first = resume.decide("auto", storage, is_global_zero=True)
    assert first.point == ResumePoint(url=url, epoch=0, global_step=4) and first.resumed_count == 2
    other = resume.decide("auto", storage, is_global_zero=False)
    assert other.point == first.point and other.resumed_count == 2
    resume.record_start(storage, first, tmp_path / "run")  # rank 0's start, as Lightning's ranks find it
    storage.write_text("config.yaml", "seed: 1\n")
    assert resume.decide("auto", storage, is_global_zero=False).point == first.point


def test_a_rank_that_is_not_zero_decides_without_acting(storage):
    (Path(storage.path) / "checkpoints" / "last.ckpt").write_bytes(b"not a zip")
    assert resume.decide("auto", storage, is_global_zero=False) == Decision()
    assert (Path(storage.path) / "checkpoints" / "last.ckpt").exists()


def test_a_debug_run_always_starts_fresh_on_every_rank(storage):
    save_checkpoint(storage, "last.ckpt", step=4)
    assert resume.decide("auto", storage, is_global_zero=True, debug_run=True) == Decision()
    assert resume.decide("auto", storage, is_global_zero=False, debug_run=True) == Decision()


def test_what_naming_the_run_folder_found_serves_its_own_start_once(storage, tmp_path):
    # Hydra names the run's folder first (find, kept), the start's decision takes it: the records
    # are read once. Kept for another run, or taken already, it is read again.
    url = save_checkpoint(storage, "last.ckpt", step=4)
    elsewhere = RunStorage(str(tmp_path / "elsewhere"), "other-0123456789")
    elsewhere.prepare()
    resume.find("auto", elsewhere, keep=True)  # an earlier run of this process
    assert resume.find("auto", storage, keep=True).completed_summary is None
    storage.write_text("summary.json", json.dumps({"status": "completed"}))
    other = resume.decide("auto", storage, is_global_zero=False)
    assert other.point is not None and other.point.url == url  # as found when the folder was named
    assert resume.decide("auto", storage, is_global_zero=False).completed_summary is not None


def test_a_start_records_the_settings_it_trains_though_naming_its_folder_did_not_need_them(storage):
    resume.find("auto", storage, CODE_A, keep=True)  # Hydra's run folder: the code alone
    decision = resume.decide("auto", storage, is_global_zero=True, code={**CODE_A, "settings": "5e6f"})
    resume.record_start(storage, decision, Path("run-dir"))
    (start,) = json.loads(storage.read_text("run.json"))["starts"]
    assert (start["code"], start["settings"]) == (CODE_A["fingerprint"], "5e6f")


@pytest.mark.parametrize(
    "error,reason",
    [
        (OSError("disk\n  said   no"), "OSError: disk said no"),
        (ValueError("x" * 500), "ValueError: " + "x" * 200),
        (KeyError(), "KeyError: KeyError"),
    ],
)
def test_the_reason_a_checkpoint_does_not_load_is_one_short_line(error, reason, monkeypatch):
    def unreadable(url):  # what torch, zipfile, pickle or fsspec raised while reading it
        raise error

    monkeypatch.setattr(resume, "read_checkpoint", unreadable)
    with pytest.raises(resume.InvalidCheckpoint) as raised:
        resume.load_point("s3://b/x/last.ckpt")
    assert str(raised.value) == reason


def test_record_start_appends_each_start_to_run_json(storage, tmp_path):
    point = ResumePoint(url="s3://b/x/last.ckpt", epoch=2, global_step=12)
    resume.record_start(storage, Decision(), tmp_path / "run1")
    resume.record_start(
        storage, Decision(point=point, resumed_count=1, tensorboard_dir=tmp_path), tmp_path / "r2"
    )
    text = storage.read_text("run.json")
    assert text.endswith("}\n") and '\n  "identity": ' in text  # indented, for people who read it
    record = json.loads(text)
    assert record["identity"] == "default-0123456789"
    assert record["resumed_count"] == 1 and record["tensorboard_dir"] == str(tmp_path)
    first, second = record["starts"]
    assert (first["resumed_from"], first["epoch"], first["global_step"]) == (None, None, None)
    assert first["run_dir"] == str(tmp_path / "run1")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", first["at"])
    resume.record_start(storage, Decision(), tmp_path / "r3")
    assert json.loads(storage.read_text("run.json"))["tensorboard_dir"] is None
    assert (second["resumed_from"], second["epoch"], second["global_step"]) == (point.url, 2, 12)


def tensorboard_logger(save_dir: str, name: str | None = "tb", version: str | None = "v0"):
    return OmegaConf.create(
        {
            "_target_": "lightning.pytorch.loggers.TensorBoardLogger",
            "save_dir": save_dir,
            "name": name,
            "version": version,
        }
    )


def test_tensorboard_dir_is_the_tensorboard_loggers_save_dir_name_and_version(tmp_path):
    csv = {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": "x"}
    cfg = OmegaConf.create({"logger": {"csv": csv, "tensorboard": tensorboard_logger(str(tmp_path))}})
    assert resume.tensorboard_dir(cfg) == tmp_path / "tb" / "v0"
    cfg = OmegaConf.create({"logger": {"tensorboard": tensorboard_logger(str(tmp_path), None, None)}})
    assert resume.tensorboard_dir(cfg) == tmp_path
    assert resume.tensorboard_dir(OmegaConf.create({"logger": {"csv": csv, "off": None}})) is None
    assert resume.tensorboard_dir(OmegaConf.create({"logger": None})) is None


def test_a_resumed_tensorboard_logger_continues_the_recorded_directory_from_the_checkpoint_step(tmp_path):
    point = ResumePoint(url="x", epoch=1, global_step=40)
    run = type("Run", (), {"resume": Decision(point=point, tensorboard_dir=tmp_path / "tb" / "v0")})()
    arguments = resume.logger_arguments(tensorboard_logger(str(tmp_path)), run)
    assert arguments == {"save_dir": str(tmp_path / "tb"), "name": "v0", "version": "", "purge_step": 40}
    csv = OmegaConf.create({"_target_": "lightning.pytorch.loggers.CSVLogger"})
    assert resume.logger_arguments(csv, run) == {}
    fresh = type("Run", (), {"resume": Decision(tensorboard_dir=tmp_path)})()
    assert resume.logger_arguments(tensorboard_logger(str(tmp_path)), fresh) == {}
    assert resume.logger_arguments(tensorboard_logger(str(tmp_path)), object()) == {}


def test_a_resumed_run_on_the_same_machine_continues_the_recorded_tensorboard_dir(storage, tmp_path, caplog):
    previous, own, run_dir = tmp_path / "first" / "tb", tmp_path / "second" / "tb", tmp_path / "second"
    previous.mkdir(parents=True)
    run_dir.mkdir()
    decision = Decision(point=ResumePoint("x", 0, 4), tensorboard_dir=previous)
    with caplog.at_level(logging.INFO, logger="litlab"):
        resume.continue_tensorboard(decision, own, storage)
    assert list(run_dir.iterdir()) == []  # no pointer file: summary.json names the directory
    assert decision.tensorboard_dir == previous
    assert caplog.messages == [f"resume: TensorBoard continues in {previous}"]


def test_a_resumed_run_in_its_own_recorded_directory_continues_it(storage, tmp_path):
    own = tmp_path / "tb"
    own.mkdir()
    decision = Decision(point=ResumePoint("x", 0, 4), tensorboard_dir=own)
    resume.continue_tensorboard(decision, own, storage)
    assert decision.tensorboard_dir == own


def test_a_resumed_run_without_tensorboard_records_none(storage, tmp_path):
    decision = Decision(point=ResumePoint("x", 0, 4), tensorboard_dir=tmp_path)
    resume.continue_tensorboard(decision, None, storage)
    assert decision.tensorboard_dir is None


def test_a_resumed_run_on_a_new_machine_restores_the_stored_event_files(storage, tmp_path, caplog):
    events = Path(storage.path) / "tensorboard"
    events.mkdir()
    (events / "events.out.tfevents.1").write_bytes(b"e1")
    own = tmp_path / "run" / "tb"
    decision = Decision(point=ResumePoint("x", 0, 4), tensorboard_dir=tmp_path / "gone")
    with caplog.at_level(logging.INFO, logger="litlab"):
        resume.continue_tensorboard(decision, own, storage)
    assert (own / "events.out.tfevents.1").read_bytes() == b"e1"
    assert decision.tensorboard_dir == own
    assert caplog.messages == [f"resume: restored 1 TensorBoard event file(s) from {storage.url}"]


def test_a_fresh_run_keeps_its_own_tensorboard_dir(storage, tmp_path):
    decision = Decision(tensorboard_dir=tmp_path / "old")
    resume.continue_tensorboard(decision, tmp_path / "own", storage)
    assert decision.tensorboard_dir == tmp_path / "own"


# --- a code change is a new run (litlab.config.identity.code_version records, as prepare_run passes them) --

CODE_A = {"fingerprint": "a" * 40, "files": {"project/module.py": "1", "configs/model/cnn.yaml": "1"}}
CODE_B = {"fingerprint": "b" * 40, "files": {"project/module.py": "2", "configs/model/cnn.yaml": "1"}}
CODE_C = {"fingerprint": "c" * 40, "files": {"project/module.py": "3", "project/new.py": "1"}}


def version_folder(storage: RunStorage, code: dict) -> str:
    """The folder of a version of the run: 8 hex digits of its code's and settings' fingerprints."""
    digest = hashlib.sha1(f"{code['fingerprint']} {code.get('settings')}".encode()).hexdigest()
    return f"{storage.identity}-{digest[:8]}"


def started_with(storage: RunStorage, code: dict, completed: bool) -> None:
    """A run's storage folder as a start with ``code`` leaves it: run.json, a checkpoint, and a
    completed summary.json when ``completed``."""
    storage.prepare()
    save_checkpoint(storage, "last.ckpt", step=4)
    resume.record_start(storage, Decision(code=code), Path("run-dir"))
    if completed:
        storage.write_text("summary.json", json.dumps({"status": "completed", "global_step": 4}))


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_run_completed_with_other_code_is_a_new_run_in_a_folder_of_its_own(storage):
    started_with(storage, CODE_A, completed=True)
    decision = resume.decide("auto", storage, is_global_zero=True, code=CODE_B)
    assert decision.identity == version_folder(storage, CODE_B)
    assert decision.point is None and decision.completed_summary is None  # trains from scratch
    # Another rank reaches the same folder.
    assert resume.decide("auto", storage, is_global_zero=False, code=CODE_B).identity == decision.identity
    new = RunStorage(storage.root, decision.identity)
    started_with(new, CODE_B, completed=True)
    # The same command again, with either code: each version's run completed, nothing trains.
    again = resume.decide("auto", storage, is_global_zero=True, code=CODE_B)
    assert again.identity == new.identity and again.completed_summary is not None
    back = resume.decide("auto", storage, is_global_zero=True, code=CODE_A)
    assert back.identity is None and back.completed_summary is not None
    # The sweep's check before starting a job reads the same folders.
    assert resume.find("auto", storage, CODE_B).completed_summary == again.completed_summary
    assert resume.find("auto", storage, CODE_C).completed_summary is None


def test_the_same_code_is_the_same_run_as_before(storage):
    started_with(storage, CODE_A, completed=True)
    decision = resume.decide("auto", storage, is_global_zero=True, code=CODE_A)
    assert decision.identity is None and decision.completed_summary is not None


def test_a_run_completed_before_code_was_recorded_is_not_trained_again(storage):
    save_checkpoint(storage, "last.ckpt", step=9)
    storage.write_text("summary.json", json.dumps({"status": "completed"}))
    decision = resume.decide("auto", storage, is_global_zero=True, code=CODE_B)
    assert decision.identity is None and decision.completed_summary is not None


def test_an_unfinished_run_resumes_after_a_code_change_with_one_warning_naming_the_files(storage, caplog):
    started_with(storage, CODE_A, completed=False)  # killed, preempted, or requeued by Slurm
    with caplog.at_level(logging.INFO, logger="litlab"):
        decision = resume.decide("auto", storage, is_global_zero=True, code=CODE_B)
    assert decision.identity is None and decision.point.global_step == 4
    assert warnings_of(caplog) == [
        "resume: the code changed since run default-0123456789 last started (project/module.py); it "
        "continues from its checkpoint with the code as it is now. To train the changed code from "
        "scratch: resume=never"
    ]
    resume.record_start(storage, decision, Path("run-dir"))  # this start records the code it trains
    caplog.clear()
    assert resume.decide("auto", storage, is_global_zero=True, code=CODE_B).point.global_step == 4
    assert warnings_of(caplog) == []  # the next start compares with the code the last one ran


def test_an_unfinished_later_version_resumes_after_another_code_change(storage, caplog):
    started_with(storage, CODE_A, completed=True)
    second = RunStorage(storage.root, "default-0123456789-bbbbbbbb")  # any version's folder
    started_with(second, CODE_B, completed=False)
    with caplog.at_level(logging.WARNING, logger="litlab"):
        decision = resume.decide("auto", storage, is_global_zero=True, code=CODE_C)
    assert decision.identity == second.identity and decision.point.global_step == 4
    (warning,) = warnings_of(caplog)
    assert "(project/module.py, project/new.py (new)); it continues" in warning
    assert not Path(storage.root, version_folder(storage, CODE_C)).exists()
    # It finishes with the new code: the same command with that code finds it completed.
    resume.record_start(second, decision, Path("run-dir"))
    second.write_text("summary.json", json.dumps({"status": "completed"}))
    again = resume.decide("auto", storage, is_global_zero=True, code=CODE_C)
    assert again.identity == second.identity and again.completed_summary is not None


def test_resume_never_with_an_unfinished_other_version_starts_this_codes_own_folder(storage):
    started_with(storage, CODE_A, completed=True)
    second = RunStorage(storage.root, "default-0123456789-bbbbbbbb")
    started_with(second, CODE_B, completed=False)
    decision = resume.decide("never", storage, is_global_zero=True, code=CODE_C)
    assert decision.identity == version_folder(storage, CODE_C) and decision.point is None
    assert (Path(second.path) / "checkpoints" / "last.ckpt").is_file()  # left as it was


def test_resume_never_after_a_code_change_starts_this_codes_run_afresh(storage):
    started_with(storage, CODE_A, completed=True)
    assert resume.decide("never", storage, is_global_zero=True, code=CODE_B).identity == (
        version_folder(storage, CODE_B)
    )
    assert (Path(storage.path) / "summary.json").is_file()  # the other code's run is left alone


def test_resume_never_trains_this_codes_own_folder_on_every_rank(storage, tmp_path):
    # A later version that continued with this code and completed is left alone: what rank 0 sets
    # aside never changes which folder another rank finds.
    started_with(storage, CODE_A, completed=True)
    second = RunStorage(storage.root, "default-0123456789-bbbbbbbb")
    started_with(second, CODE_C, completed=True)  # continued there with CODE_C, and finished
    first = resume.decide("never", storage, is_global_zero=True, code=CODE_C)
    assert first.identity == version_folder(storage, CODE_C)
    first.folder.prepare()  # what rank 0's start does (lifecycle.prepare_run)
    resume.continue_tensorboard(first, None, first.folder)
    resume.record_start(first.folder, first, tmp_path / "run")
    assert resume.decide("never", storage, is_global_zero=False, code=CODE_C).identity == first.identity
    assert (Path(second.path) / "summary.json").is_file()  # left as it was


# --- other settings under a name the user chose (run_name): settings fingerprints, as prepare_run passes them


def with_settings(code: dict, settings: str) -> dict:
    return {**code, "settings": settings * 40, "spelled": settings * 40}


def test_a_run_completed_with_other_settings_is_a_new_run_in_a_folder_of_its_own(storage):
    """``run_name=exp trainer.max_epochs=1``, then ``... trainer.max_epochs=3``: the run of one epoch
    is not that command's result. Each settings' run completes once; the same settings find it."""
    one_epoch, three_epochs = with_settings(CODE_A, "1"), with_settings(CODE_A, "3")
    started_with(storage, one_epoch, completed=True)
    decision = resume.decide("auto", storage, is_global_zero=True, code=three_epochs)
    assert decision.identity.startswith(f"{storage.identity}-") and decision.completed_summary is None
    assert decision.point is None  # trains from scratch
    started_with(RunStorage(storage.root, decision.identity), three_epochs, completed=True)
    again = resume.decide("auto", storage, is_global_zero=True, code=three_epochs)
    assert again.identity == decision.identity and again.completed_summary is not None
    back = resume.decide("auto", storage, is_global_zero=True, code=one_epoch)
    assert back.identity is None and back.completed_summary is not None
    other = resume.find("auto", storage, with_settings(CODE_A, "5"))
    assert other.completed_summary is None and other.identity not in (None, decision.identity)
    # Other code with the same settings is a version of its own too.
    assert resume.find("auto", storage, with_settings(CODE_B, "1")).identity not in (None, decision.identity)


def test_an_unfinished_run_resumes_after_a_settings_change_with_the_change_marked(storage):
    started_with(storage, with_settings(CODE_A, "1"), completed=False)
    decision = resume.decide("auto", storage, is_global_zero=True, code=with_settings(CODE_A, "3"))
    assert decision.identity is None and decision.point.global_step == 4
    assert decision.resumed_across == ["settings 11111111→33333333"]
