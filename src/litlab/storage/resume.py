"""The resume decision: continue a run identity from its newest valid checkpoint, or start it fresh.

``decide`` applies ``resume=auto|never|PATH`` to ``<storage.root>/<run identity>/``, reading storage
once per start: a completed run is not trained again (one completed with other code or settings
gets a folder of its own, ``<identity>-<version[:8]>``); an unfinished one continues from its newest
checkpoint that loads, whatever changed, with a warning. ``find`` is its read-only first half (the folder and
the completed summary), which names the run's folder and the pool's check before a job starts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from litlab.errors import one_line
from litlab.storage.roots import RunStorage, read_checkpoint

log = logging.getLogger("litlab")

AUTO, NEVER = "auto", "never"
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
    identity: str | None = None  # the storage folder, where not the identity's own: see ``find``
    why: str | None = None  # why the run is stored there, for its log
    code: dict[str, Any] | None = field(default=None, compare=False)  # this start's, run.json records it
    resumed_across: list[str] = field(default_factory=list)  # "code a→b": trained partly under each
    folder: RunStorage | None = field(default=None, compare=False, repr=False)  # where the run is stored
    record: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # its run.json


def load_point(url: str) -> ResumePoint:
    """Load a checkpoint (safely, ``weights_only``) to prove it is usable; raises InvalidCheckpoint.

    The whole file is read: truncation shows at its end, and a partial read could pass a file whose
    middle is damaged. Lightning loads it again in ``fit``; the cost is one extra read per resume.
    """
    try:
        checkpoint = read_checkpoint(url)
    except Exception as error:  # torch, zipfile, pickle and fsspec each raise their own
        raise InvalidCheckpoint(f"{type(error).__name__}: {one_line(error)[:200]}") from None
    if not isinstance(checkpoint, dict) or not {"state_dict", "loops", "global_step"} <= checkpoint.keys():
        raise InvalidCheckpoint("not a Lightning training checkpoint (no state_dict, loops or global_step)")
    return ResumePoint(url, int(checkpoint.get("epoch", 0)), int(checkpoint["global_step"]))


# The records a start found when Hydra named its run folder, for that start's ``decide``: at most one.
_KEPT: dict[tuple[str, str, str | None], Decision] = {}


def find(mode: str, storage: RunStorage, code: dict[str, Any] | None = None, keep: bool = False) -> Decision:
    """The decision as the stored records make it, read-only, before any checkpoint is loaded: the
    folder for this code and settings (``Decision.folder``, ``.identity``) and, for ``resume=auto``,
    the summary of a run that completed there. ``keep``: kept (or the kept one reused) for this
    start's ``decide``, which takes it: a start reads the records once.

    The folder is the identity's own (while empty, the ``earlier`` one of ``code`` where that holds
    the run, but with ``resume=never``) while it is empty, unfinished (a preempted or crashed run
    continues whatever changed: a Slurm requeue never starts over), or completed with this code and
    settings (or before litlab recorded them). Once it completed otherwise, a folder of a later
    version: the one named for these (always with ``resume=never``: what it sets aside never changes
    which folder another rank finds) or else one that completed with them, or else the newest
    unfinished one, as the identity's own would be.
    """
    key = (storage.url, mode, code and code["fingerprint"], code and code.get("settings"))
    found = _KEPT.get(key) if keep else _KEPT.pop(key, None)
    if found is None:
        found = _find(mode, storage, code)
        if keep:
            _KEPT.clear()
            _KEPT[key] = found
    return found


def _find(mode: str, storage: RunStorage, code: dict[str, Any] | None) -> Decision:
    own, why, earlier = storage, None, (code or {}).get("earlier")
    if earlier not in (None, storage.identity) and mode != NEVER and not storage.has_files():
        stored = RunStorage(storage.root, earlier, storage.options)
        storage, why = (stored, "is stored under its earlier name") if stored.has_files() else (storage, None)
    folder, summary, record = storage, _read_json(storage, "summary.json"), _read_json(storage, RECORD)
    if code is not None and _completed(summary) and not _trained_the_same(record, code):
        version = hashlib.sha1(f"{code['fingerprint']} {code.get('settings')}".encode()).hexdigest()
        folder = RunStorage(storage.root, f"{storage.identity}-{version[:8]}", storage.options)
        why = "completed with other code or settings"
        if mode != NEVER and not folder.has_files():
            completed, unfinished = _later_versions(storage)
            with_these = [f for f, _, r in completed if _trained_the_same(r, code)]
            if with_these:  # an unfinished version that continued with this code and settings, and finished
                folder = with_these[0]
            elif unfinished:
                folder = unfinished[0][0]
        summary, record = _read_json(folder, "summary.json"), _read_json(folder, RECORD)
    return Decision(
        completed_summary=summary if mode == AUTO and _completed(summary) else None,
        identity=folder.identity if folder is not own else None,
        why=why,
        code=code,
        folder=folder,
        record=record,
    )


def decide(
    mode: str,
    storage: RunStorage,
    is_global_zero: bool,
    debug_run: bool = False,
    code: dict[str, Any] | None = None,
) -> Decision:
    """What this start of the run does: resume from a checkpoint, start fresh, or nothing (completed).

    ``code`` is the user's code and settings as they are now (``litlab.config.identity.start_record``):
    with it, the decision is made in the storage folder of that code and settings (``find``). A
    ``debug_run`` (``trainer.fast_dev_run``) writes no checkpoints and is never "completed": it
    always starts fresh, so it can be repeated.

    Every rank decides for itself, from the same config and storage, and reaches rank 0's decision
    whoever launched it (Lightning, torchrun, Slurm): only global rank 0 changes storage here, and
    nothing it changes (leftovers of interrupted writes, files that cannot be loaded or that
    ``resume=never`` sets aside, run.json) changes another rank's answer. That is the one way ranks
    agree: the three launchers share no channel before the process group exists, but every rank
    has the command and the storage.
    """
    if debug_run:
        return Decision(code=code, folder=storage)
    decision = find(mode, storage, code)
    folder, record = decision.folder, decision.record
    assert folder is not None
    if mode == NEVER:
        if is_global_zero and folder.has_files():
            log.info("resume=never: moved the earlier files of %s to %s", folder.url, folder.set_aside())
        return decision
    if mode != AUTO:  # an explicit checkpoint
        try:
            point = load_point(mode)
        except InvalidCheckpoint as error:  # the user's own choice: reported, not skipped
            raise InvalidCheckpoint(f"resume={mode} cannot be resumed from: {error}") from None
        return _resuming(decision, point, is_global_zero)
    if decision.completed_summary is not None:
        return decision
    if is_global_zero:
        for leftover in folder.remove_temporaries():
            log.info("resume: removed %s, left by a write that was interrupted", leftover)
    point, skipped = None, []
    for url, _ in folder.checkpoints():  # the newest that loads; each newer one skipped with a warning
        try:
            point = load_point(url)
            break
        except InvalidCheckpoint as error:
            if is_global_zero:
                log.warning("resume: skipping %s, it cannot be loaded (%s)", url, error)
            skipped.append(url)
    if point is None:
        if skipped and is_global_zero:
            log.warning(
                "resume: no checkpoint of %s can be loaded; starting fresh, the unusable files moved to %s",
                folder.url,
                folder.set_aside(),
            )
        return decision
    changed = _changed_since(record, code)
    if changed and is_global_zero:
        log.warning(
            "resume: the code changed since run %s last started (%s); it continues from its checkpoint "
            "with the code as it is now. To train the changed code from scratch: resume=never",
            folder.identity,
            ", ".join(changed),
        )
    return _resuming(decision, point, is_global_zero)


def _resuming(decision: Decision, point: ResumePoint, is_global_zero: bool) -> Decision:
    record = decision.record
    resumed_before = int(record.get("resumed_count", 0))
    if is_global_zero:  # said once: every rank reaches the same point
        log.info(
            "resuming from %s (epoch %d, step %d); resumed %d time(s) before",
            point.url,
            point.epoch,
            point.global_step,
            resumed_before,
        )
    decision.point, decision.resumed_count = point, resumed_before + 1
    recorded = record.get("tensorboard_dir")
    decision.tensorboard_dir = Path(recorded) if recorded else None
    recorded, code = record.get("code"), decision.code
    if code and isinstance(recorded, dict) and _trained_the_same(record, code):
        # Its recorded fingerprints: litlab computed them otherwise until 2026-12, no change of the run's.
        decision.code = {**code, **{key: value for key, value in recorded.items() if value and key in code}}
    # What changed between the starts that trained the run (since it last started fresh) and this
    # one: ["code 8373778d→c6928336"], ["settings 1a2b3c4d→5e6f7a8b"] (a fixed run_name).
    starts = [*(record.get("starts") or []), _fingerprints(decision.code)]
    fresh = max((i for i, start in enumerate(starts[:-1]) if not start.get("resumed_from")), default=0)
    for what in ("code", "settings"):
        seen = [str(s[what])[:8] for s in starts[fresh:] if s.get(what)]
        versions = [v for i, v in enumerate(seen) if i == 0 or seen[i - 1] != v]
        if len(versions) > 1:
            decision.resumed_across.append(f"{what} {'→'.join(versions)}")
    return decision


def _fingerprints(code: dict[str, Any] | None) -> dict[str, Any]:
    """A start's record of what it trains: the code's and the settings' fingerprints."""
    return {"code": code["fingerprint"], "settings": code.get("settings")} if code else {}


def _completed(summary: dict[str, Any]) -> bool:
    return summary.get("status") == "completed"


def _later_versions(storage: RunStorage) -> tuple[list[tuple], list[tuple]]:
    """The identity's folders of later code versions, each with its summary and run.json: the
    completed ones, and the unfinished ones (newest start first)."""
    parent = storage.path.rpartition("/")[0]
    try:
        names = [
            str(n).rstrip("/").rpartition("/")[2] for n in storage.fs.ls(parent, detail=False, refresh=True)
        ]
    except FileNotFoundError:
        return [], []
    pattern = re.compile(re.escape(storage.identity) + "-[0-9a-f]{8}")
    completed, unfinished = [], []
    for name in sorted(n for n in names if pattern.fullmatch(n)):
        folder = RunStorage(storage.root, name, storage.options)
        found = (folder, _read_json(folder, "summary.json"), _read_json(folder, RECORD))
        if _completed(found[1]):
            completed.append(found)
        elif folder.has_files():
            unfinished.append(found)
    last_start = lambda found: str(((found[2].get("starts") or [{}])[-1]).get("at") or "")  # noqa: E731
    return completed, sorted(unfinished, key=last_start, reverse=True)


def _trained_the_same(record: dict[str, Any], code: dict[str, Any]) -> bool:
    """Whether the run's last start (its run.json) trained this code and these settings; what it
    did not record (older litlab) counts as the same."""
    recorded = record.get("code") if isinstance(record.get("code"), dict) else {}
    settings = (code.get("settings"), code.get("spelled"))
    return not _changed_since(record, code) and recorded.get("settings") in (None, *settings)


def _changed_since(record: dict[str, Any], code: dict[str, Any] | None) -> list[str]:
    """The files of this code that changed since the run's last start recorded its code, or are new
    (none if either is unknown): a file the run no longer uses changed what imported it."""
    recorded = record.get("code")
    if code is None or not isinstance(recorded, dict) or recorded.get("fingerprint") == code["fingerprint"]:
        return []
    before, now = recorded.get("files") or {}, sorted(code["files"].items())
    return [name if name in before else f"{name} (new)" for name, digest in now if before.get(name) != digest]


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
    record = _read_json(storage, RECORD)
    point = decision.point
    start = {
        "at": dt.datetime.now().isoformat(timespec="seconds"),
        "run_dir": str(run_dir),
        "resumed_from": point.url if point else None,
        "epoch": point.epoch if point else None,
        "global_step": point.global_step if point else None,
        "code": None,
        **_fingerprints(decision.code),
    }
    record.update(
        identity=storage.identity,
        resumed_count=decision.resumed_count,
        tensorboard_dir=str(decision.tensorboard_dir) if decision.tensorboard_dir else None,
        starts=[*record.get("starts", []), start],
    )
    if decision.code is not None:  # the code this start trains with: the next start compares with it
        record["code"] = decision.code
    storage.write_text(RECORD, json.dumps(record, indent=2) + "\n")


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
