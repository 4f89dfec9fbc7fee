"""The resume decision: continue a run identity from its newest valid checkpoint, or start it fresh.

``decide`` applies ``resume=auto|never|PATH`` to ``<storage.root>/<run identity>/``: a completed run is
not trained again (a run completed with other code gets a folder of its own, ``folder_for_code``); an
unfinished one continues from its newest checkpoint that loads, whatever changed, with a warning.
Rank 0 decides and hands the decision to the ranks Lightning launches.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from litlab.storage.roots import RunStorage
from litlab.torchrun import agreed_with_rank_zero

log = logging.getLogger("litlab")

AUTO, NEVER = "auto", "never"
DECISION_ENV = "LITLAB_RESUME_DECISION"  # rank 0's decision, inherited by the ranks Lightning launches
RECORD = "run.json"


class InvalidCheckpoint(Exception):
    """A checkpoint that cannot be resumed from (truncated, corrupt, not a Lightning checkpoint)."""


@dataclass(frozen=True)
class ResumePoint:
    url: str
    epoch: int
    global_step: int


@dataclass
class Decision:
    point: ResumePoint | None = None
    completed_summary: dict[str, Any] | None = None  # the stored summary of a run that already finished
    resumed_count: int = 0
    tensorboard_dir: Path | None = None  # where a resumed run's TensorBoard logger continues
    identity: str | None = None  # the storage folder of another version of the code than the first
    code: dict[str, Any] | None = field(default=None, compare=False)  # this start's, run.json records it
    resumed_across: list[str] = field(default_factory=list)  # "code a→b": trained partly under each


def load_point(url: str) -> ResumePoint:
    """Load a checkpoint (safely, ``weights_only``) to prove it is usable; raises InvalidCheckpoint.

    The whole file is read: truncation shows at its end, and a partial read could pass a file whose
    middle is damaged. Lightning loads it again in ``fit``; the cost is one extra read per resume.
    """
    from litlab.storage.roots import read_checkpoint

    try:
        checkpoint = read_checkpoint(url)
    except Exception as error:  # torch, zipfile, pickle and fsspec each raise their own
        raise InvalidCheckpoint(f"{type(error).__name__}: {_first_line(error)}") from None
    if not isinstance(checkpoint, dict) or not {"state_dict", "loops", "global_step"} <= checkpoint.keys():
        raise InvalidCheckpoint("not a Lightning training checkpoint (no state_dict, loops or global_step)")
    return ResumePoint(
        url=url, epoch=int(checkpoint.get("epoch", 0)), global_step=int(checkpoint["global_step"])
    )


def newest_valid_checkpoint(storage: RunStorage) -> tuple[ResumePoint | None, list[str]]:
    """The newest checkpoint that loads, and the newer ones that did not (each skipped with a warning)."""
    skipped = []
    for url, _ in storage.checkpoints():
        try:
            return load_point(url), skipped
        except InvalidCheckpoint as error:
            log.warning("resume: skipping %s, it cannot be loaded (%s)", url, error)
            skipped.append(url)
    return None, skipped


def decide(
    mode: str,
    storage: RunStorage,
    is_global_zero: bool,
    debug_run: bool = False,
    code: dict[str, Any] | None = None,
) -> Decision:
    """What this start of the run does: resume from a checkpoint, start fresh, or nothing (completed).

    ``code`` is the user's code as it is now (``litlab.config.identity.CodeVersion.record``): with it,
    the decision is made in that code's storage folder (``folder_for_code``; ``Decision.identity``).
    A ``debug_run`` (``trainer.fast_dev_run``) writes no checkpoints and is never "completed": it
    always starts fresh, so it can be repeated.
    """
    inherited = json.loads(os.environ.get(DECISION_ENV, "{}"))
    # A rank Lightning's launcher started. Only for this run's storage: a process that ran a run in
    # itself (a notebook, a test session) hands its stale decision to every process it starts.
    if not is_global_zero and inherited.get("storage") == storage.url:
        return _decision_from_env(os.environ[DECISION_ENV])
    decided: list[Decision] = []

    def rank_zero_decides() -> str:
        decided.append(Decision() if debug_run else _decide(mode, storage, act=True, code=code))
        return _decision_to_env(decided[0], storage)

    shared = agreed_with_rank_zero("resume", rank_zero_decides)  # ranks torchrun started
    if shared is not None:
        decision = decided[0] if decided else _decision_from_env(shared)
    else:
        decision = Decision() if debug_run else _decide(mode, storage, act=is_global_zero, code=code)
    if is_global_zero:
        os.environ[DECISION_ENV] = _decision_to_env(decision, storage)
    return decision


def _decision_to_env(decision: Decision, storage: RunStorage) -> str:
    point = asdict(decision.point) if decision.point else None
    completed = decision.completed_summary
    return json.dumps(
        {
            "storage": storage.url,
            "identity": decision.identity,
            "point": point,
            "resumed": decision.resumed_count,
            "completed": completed,
        }
    )


def _decide(mode: str, storage: RunStorage, act: bool, code: dict[str, Any] | None = None) -> Decision:
    folder = folder_for_code(storage, code, continue_unfinished=mode != NEVER)
    decision = _decide_in(mode, folder, act, code)
    decision.identity = folder.identity if folder.identity != storage.identity else None
    decision.code = code
    return decision


def _decide_in(mode: str, storage: RunStorage, act: bool, code: dict[str, Any] | None) -> Decision:
    record = _read_record(storage)
    resumed_before = int(record.get("resumed_count", 0))
    if mode == NEVER:
        if act and storage.has_files():
            log.info("resume=never: moved the earlier files of %s to %s", storage.url, storage.set_aside())
        return Decision()
    if mode != AUTO:  # an explicit checkpoint
        try:
            point = load_point(mode)
        except InvalidCheckpoint as error:  # the user's own choice: reported, not skipped
            raise InvalidCheckpoint(f"resume={mode} cannot be resumed from: {error}") from None
        return _resuming(point, resumed_before, record)
    summary = _read_json(storage, "summary.json")
    if summary.get("status") == "completed":
        return Decision(completed_summary=summary)
    if act:
        for leftover in storage.remove_temporaries():
            log.info("resume: removed %s, left by a write that was interrupted", leftover)
    point, skipped = newest_valid_checkpoint(storage)
    if point is None:
        if skipped and act:
            log.warning(
                "resume: no checkpoint of %s can be loaded; starting fresh, the unusable files moved to %s",
                storage.url,
                storage.set_aside(),
            )
        return Decision()
    changed = _changed_since(record, code)
    if changed and act:
        log.warning(
            "resume: the code changed since run %s last started (%s); it continues from its checkpoint "
            "with the code as it is now. To train the changed code from scratch: resume=never",
            storage.identity,
            ", ".join(changed),
        )
    decision = _resuming(point, resumed_before, record)
    decision.resumed_across = _versions_trained(record, code)
    return decision


def _versions_trained(record: dict[str, Any], code: dict[str, Any] | None) -> list[str]:
    """What changed between the starts that trained the run (since it last started fresh) and this
    one: ``["code 8373778d→c6928336"]``, ``["settings 1a2b3c4d→5e6f7a8b"]`` (a fixed run_name)."""
    starts = [*(record.get("starts") or []), _fingerprints(code)]
    fresh = max((i for i, start in enumerate(starts[:-1]) if not start.get("resumed_from")), default=0)
    changes = []
    for what in ("code", "settings"):
        seen = [str(s[what])[:8] for s in starts[fresh:] if s.get(what)]
        versions = [v for i, v in enumerate(seen) if i == 0 or seen[i - 1] != v]
        if len(versions) > 1:
            changes.append(f"{what} {'→'.join(versions)}")
    return changes


def _fingerprints(code: dict[str, Any] | None) -> dict[str, Any]:
    """A start's record of what it trains: the code's and the settings' fingerprints."""
    return {"code": code["fingerprint"], "settings": code.get("settings")} if code else {}


def _resuming(point: ResumePoint, resumed_before: int, record: dict[str, Any]) -> Decision:
    log.info(
        "resuming from %s (epoch %d, step %d); resumed %d time(s) before",
        point.url,
        point.epoch,
        point.global_step,
        resumed_before,
    )
    recorded = record.get("tensorboard_dir")
    return Decision(
        point=point,
        resumed_count=resumed_before + 1,
        tensorboard_dir=Path(recorded) if recorded else None,
    )


def _decision_from_env(text: str) -> Decision:
    data = json.loads(text)
    point = ResumePoint(**data["point"]) if data["point"] else None
    return Decision(
        point=point,
        resumed_count=int(data["resumed"]),
        completed_summary=data.get("completed"),
        identity=data.get("identity"),
    )


# --- versions of the user's code ------------------------------------------------------------------


def folder_for_code(
    storage: RunStorage, code: dict[str, Any] | None, continue_unfinished: bool = True
) -> RunStorage:
    """The storage folder of the run identity ``storage`` for the user's code ``code``.

    The identity's own folder while it is empty, unfinished (a preempted or crashed run continues
    whatever changed: a Slurm requeue never starts over), or completed with this code (or before
    litlab recorded code). Once it completed with other code, a folder of a later version: the one
    named for this code (``<identity>-<fingerprint[:8]>``) or one that completed with it; else,
    when ``continue_unfinished``, the newest unfinished one, as the identity's own would be; else a
    new one named for this code.
    """
    if code is None or _read_json(storage, "summary.json").get("status") != "completed":
        return storage
    if _recorded_code(_read_record(storage)) in (None, code["fingerprint"]):
        return storage
    own = RunStorage(storage.root, f"{storage.identity}-{code['fingerprint'][:8]}", storage.options)
    if own.has_files():
        return own
    completed, unfinished = _later_versions(storage)
    for folder in completed:  # an unfinished version that continued with this code, and finished
        if _recorded_code(_read_record(folder)) == code["fingerprint"]:
            return folder
    return unfinished[0] if unfinished and continue_unfinished else own


def completed_summary(storage: RunStorage, code: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored summary of the run when it completed with this code (``resume=auto`` would stop at
    it), read without loading any checkpoint."""
    summary = _read_json(folder_for_code(storage, code), "summary.json")
    return summary if summary.get("status") == "completed" else None


def _later_versions(storage: RunStorage) -> tuple[list[RunStorage], list[RunStorage]]:
    """The identity's folders of later code versions: the completed ones, and the unfinished ones
    (newest start first)."""
    parent = storage.path.rpartition("/")[0]
    try:
        names = [
            str(n).rstrip("/").rpartition("/")[2] for n in storage.fs.ls(parent, detail=False, refresh=True)
        ]
    except FileNotFoundError:
        return [], []
    pattern = re.compile(re.escape(storage.identity) + "-[0-9a-f]{8}")
    folders = [RunStorage(storage.root, n, storage.options) for n in sorted(names) if pattern.fullmatch(n)]
    completed, unfinished = [], []
    for folder in folders:
        if _read_json(folder, "summary.json").get("status") == "completed":
            completed.append(folder)
        elif folder.has_files():
            unfinished.append(folder)
    return completed, sorted(unfinished, key=_last_start, reverse=True)


def _last_start(storage: RunStorage) -> str:
    starts = _read_record(storage).get("starts") or [{}]
    return str(starts[-1].get("at") or "")


def _recorded_code(record: dict[str, Any]) -> str | None:
    code = record.get("code")
    return code.get("fingerprint") if isinstance(code, dict) else None


def _changed_since(record: dict[str, Any], code: dict[str, Any] | None) -> list[str]:
    """The files that changed since the run's last start recorded its code (none if either is unknown)."""
    recorded = record.get("code")
    if code is None or not isinstance(recorded, dict) or recorded.get("fingerprint") == code["fingerprint"]:
        return []
    before, now = recorded.get("files") or {}, code["files"]
    changed = [n for n in sorted(before.keys() & now.keys()) if before[n] != now[n]]
    changed += [f"{n} (new)" for n in sorted(now.keys() - before.keys())]
    return changed + [f"{n} (removed)" for n in sorted(before.keys() - now.keys())]


def completed_message(storage: RunStorage, summary: dict[str, Any]) -> str:
    return (
        f"run {storage.identity} already completed ({summary.get('epochs')} epochs, "
        f"{summary.get('global_step')} steps, summary: {storage.url_of('summary.json')}); not training "
        "it again. To train it from scratch: resume=never (the finished run's files are moved aside) "
        "or another run_name; to train it further: resume=<checkpoint> with a larger trainer.max_epochs"
    )


# --- TensorBoard continuity ----------------------------------------------------------------------


def tensorboard_dir(cfg: DictConfig) -> Path | None:
    """The log directory the config's TensorBoard logger would write (save_dir/name/version)."""
    for logger in (cfg.get("logger") or {}).values():
        if logger is not None and str(logger.get("_target_", "")).endswith("TensorBoardLogger"):
            return (
                Path(str(logger.save_dir)) / str(logger.get("name") or "") / str(logger.get("version") or "")
            )
    return None


def continue_tensorboard(decision: Decision, own_dir: Path | None, storage: RunStorage) -> None:
    """Point a resumed run's TensorBoard at the run's log directory, so its curves continue.

    On the machine that started the run, that is the directory recorded in run.json (summary.json's
    ``tensorboard_dir`` names it). On a new machine, the event files copied into the storage folder
    (``storage.copy_logs``) are restored into this run's own directory.
    """
    if own_dir is None or decision.point is None:
        decision.tensorboard_dir = own_dir
        return
    previous = decision.tensorboard_dir
    if previous is not None and previous.is_dir():
        log.info("resume: TensorBoard continues in %s", previous)
        return
    restored = storage.download("tensorboard", own_dir)
    if restored:
        log.info("resume: restored %d TensorBoard event file(s) from %s", restored, storage.url)
    decision.tensorboard_dir = own_dir


def logger_arguments(logger_cfg: DictConfig, run: Any) -> dict[str, Any]:
    """Extra arguments that make a resumed run's TensorBoard logger continue the same log directory."""
    decision = getattr(run, "resume", None)
    if decision is None or decision.point is None or decision.tensorboard_dir is None:
        return {}
    if not str(logger_cfg.get("_target_", "")).endswith("TensorBoardLogger"):
        return {}
    directory = decision.tensorboard_dir
    # purge_step: TensorBoard hides what the interrupted process logged after its checkpoint (the
    # resumed run logs its first step at the checkpoint's global step, wherever it was saved).
    return {
        "save_dir": str(directory.parent),
        "name": directory.name,
        "version": "",
        "purge_step": decision.point.global_step,
    }


# --- run.json: the run's history across restarts -------------------------------------------------


def record_start(storage: RunStorage, decision: Decision, run_dir: Path) -> None:
    """Append this start to ``<storage folder>/run.json`` (rank 0)."""
    record = _read_record(storage)
    starts = record.get("starts", [])
    starts.append(
        {
            "at": dt.datetime.now().isoformat(timespec="seconds"),
            "run_dir": str(run_dir),
            "resumed_from": decision.point.url if decision.point else None,
            "epoch": decision.point.epoch if decision.point else None,
            "global_step": decision.point.global_step if decision.point else None,
            "code": None,
            **_fingerprints(decision.code),
        }
    )
    record.update(
        identity=storage.identity,
        resumed_count=decision.resumed_count,
        tensorboard_dir=str(decision.tensorboard_dir) if decision.tensorboard_dir else None,
        starts=starts,
    )
    if decision.code is not None:  # the code this start trains with: the next start compares with it
        record["code"] = decision.code
    storage.write_text(RECORD, json.dumps(record, indent=2) + "\n")


def _read_record(storage: RunStorage) -> dict[str, Any]:
    return _read_json(storage, RECORD)


def _read_json(storage: RunStorage, name: str) -> dict[str, Any]:
    text = storage.read_text(name)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        log.warning("resume: %s is not valid JSON; ignoring it", storage.url_of(name))
        return {}
    return value if isinstance(value, dict) else {}


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:200] or type(error).__name__
