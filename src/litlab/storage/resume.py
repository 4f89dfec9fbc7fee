"""The resume decision (``resume=auto|never|PATH``, docs/storage.md): continue a run identity from its
newest checkpoint that loads, start it fresh, or not at all (completed). Every rank decides alone, from
the same command and storage (the launchers share no channel before the process group exists): only
global rank 0 changes storage, and nothing it changes alters another rank's answer."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import itertools
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
from omegaconf import DictConfig

from litlab.errors import one_line
from litlab.storage.roots import TEMPORARY_SUFFIX, RunStorage

log = logging.getLogger("litlab")

AUTO, NEVER = "auto", "never"
_RECORD = "run.json"
# The record of a start in the run's folder (the storage folder when storage is local): Hydra's, and a
# sweep job's command and output; not what the run stored. Every start appends to the logs.
_START_RECORD = (".hydra", "train.log", "command.sh", "output.log")
_APPENDED_LOGS = ("train.log", "output.log")


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


def read_checkpoint(url: str) -> dict:
    """A checkpoint's contents from any fsspec URL, loaded safely (``weights_only``) without its tensors'
    bytes (on the meta device): its zip directory, at the end, and its pickle are what is read."""
    import torch

    with fsspec.open(url, "rb", block_size=2**20) as f:  # small parts: not S3's 50 MiB blocks
        return torch.load(f, map_location="meta", weights_only=True)


def load_point(url: str) -> ResumePoint:
    """Where a checkpoint resumes; InvalidCheckpoint for one truncated, or whose directory or pickle is
    damaged. Its tensors are read once, by Lightning (``AtomicCheckpointIO`` names a damaged one)."""
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
    """``decide``'s read-only first half: the run's folder for this code and settings (``.folder``,
    ``.identity``) and, for ``resume=auto``, the summary of a run completed there. ``keep``: kept for
    this start's ``decide``, which takes it: a start reads the records once."""
    key = (storage.url, mode, code and code["fingerprint"], code and code.get("settings"))
    found = _KEPT.get(key) if keep else _KEPT.pop(key, None)
    if found is None:
        found = _find(mode, storage, code)
        if keep:
            _KEPT.clear()
            _KEPT[key] = found
    return found


def _find(mode: str, storage: RunStorage, code: dict[str, Any] | None) -> Decision:
    # The identity's own folder while it is empty (then its earlier name's, where that holds the run),
    # unfinished (a Slurm requeue never starts over), or completed with this code and settings.
    own, why, earlier = storage, None, (code or {}).get("earlier")
    if earlier not in (None, storage.identity) and mode != NEVER and not has_files(storage):
        stored = RunStorage(storage.root, earlier, storage.options)
        storage, why = (stored, "is stored under its earlier name") if has_files(stored) else (storage, None)
    folder, summary, record = storage, _read_json(storage, "summary.json"), _read_json(storage, _RECORD)
    if code is not None and _completed(summary) and not _trained_the_same(record, code):
        version = hashlib.sha1(f"{code['fingerprint']} {code.get('settings')}".encode()).hexdigest()
        folder = RunStorage(storage.root, f"{storage.identity}-{version[:8]}", storage.options)
        why = "completed with other code or settings"
        # resume=never always takes the folder named for these: what it sets aside never changes
        # which folder another rank finds.
        if mode != NEVER and not has_files(folder):
            folder = _later_version(storage, code) or folder
        summary, record = _read_json(folder, "summary.json"), _read_json(folder, _RECORD)
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
    ``code``: the user's code and settings now (``litlab.config.identity.start_record``). A
    ``debug_run`` (``trainer.fast_dev_run``) writes no checkpoints, so it always starts fresh."""
    if debug_run:
        return Decision(code=code, folder=storage)
    decision = find(mode, storage, code)
    folder = decision.folder
    assert folder is not None
    if mode == NEVER:
        if is_global_zero and has_files(folder):
            log.info("resume=never: moved the earlier files of %s to %s", folder.url, _set_aside(folder))
        return decision
    if mode != AUTO:  # an explicit checkpoint
        try:
            point = load_point(mode)
        except InvalidCheckpoint as error:  # the user's own choice: reported, not skipped
            raise InvalidCheckpoint(f"resume={mode} cannot be resumed from: {error}") from None
        return _resuming(decision, point, is_global_zero)
    if decision.completed_summary is not None:
        return decision
    point = _newest_that_loads(folder, is_global_zero)
    if point is None:
        return decision
    changed = _changed_since(decision.record, code)
    if changed and is_global_zero:
        log.warning(
            "resume: the code changed since run %s last started (%s); it continues from its checkpoint "
            "with the code as it is now. To train the changed code from scratch: resume=never",
            folder.identity,
            ", ".join(changed),
        )
    return _resuming(decision, point, is_global_zero)


def _newest_that_loads(folder: RunStorage, is_global_zero: bool) -> ResumePoint | None:
    """The folder's newest checkpoint that loads, each newer one skipped with a warning; with none,
    rank 0 moves the unusable files aside. Rank 0 removes the leftovers of interrupted writes first."""
    if is_global_zero:
        for leftover in remove_temporaries(folder):
            log.info("resume: removed %s, left by a write that was interrupted", leftover)
    skipped = []
    for url in checkpoints(folder):
        try:
            return load_point(url)
        except InvalidCheckpoint as error:
            if is_global_zero:
                log.warning("resume: skipping %s, it cannot be loaded (%s)", url, error)
            skipped.append(url)
    if skipped and is_global_zero:
        log.warning(
            "resume: no checkpoint of %s can be loaded; starting fresh, the unusable files moved to %s",
            folder.url,
            _set_aside(folder),
        )
    return None


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
        versions = [v for v, _ in itertools.groupby(str(s[what])[:8] for s in starts[fresh:] if s.get(what))]
        if len(versions) > 1:
            decision.resumed_across.append(f"{what} {'→'.join(versions)}")
    return decision


def _fingerprints(code: dict[str, Any] | None) -> dict[str, Any]:
    """A start's record of what it trains: the code's and the settings' fingerprints."""
    return {"code": code["fingerprint"], "settings": code.get("settings")} if code else {}


def _completed(summary: dict[str, Any]) -> bool:
    return summary.get("status") == "completed"


# --- the run's storage folder, as the decision reads and changes it --------------------------------


def checkpoints(folder: RunStorage) -> list[str]:
    """URLs of the folder's checkpoint files, newest first."""
    try:
        entries = folder.fs.ls(f"{folder.path}/checkpoints", detail=True, refresh=True)
    except FileNotFoundError:
        return []
    found = [
        (folder.url_of_path(e["name"]), _modified(e))
        for e in entries
        if e["type"] == "file" and e["name"].endswith(".ckpt")
    ]
    # Ties (object stores keep whole seconds): a preemption checkpoint, then last.ckpt, come first.
    rank = {"preempted.ckpt": 0, "last.ckpt": 1}
    return [url for url, _ in sorted(found, key=lambda f: (-f[1], rank.get(f[0].rsplit("/", 1)[-1], 2)))]


def _modified(entry: dict[str, Any]) -> float:
    """An fsspec ``ls`` entry's modification time as a POSIX timestamp, whatever the backend."""
    for key in ("mtime", "LastModified", "updated", "last_modified", "created"):
        value = entry.get(key)
        if isinstance(value, str):  # gcsfs's, RFC 3339
            with contextlib.suppress(ValueError):
                value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        if isinstance(value, dt.datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0  # a backend that records no time: the ties rule orders its checkpoints


def remove_temporaries(folder: RunStorage) -> list[str]:
    """Delete what interrupted atomic writes left in the checkpoint folder (local roots only)."""
    if not folder.is_local:
        return []  # object stores publish an object only once its upload completed
    leftovers = [p for p in (Path(folder.path) / "checkpoints").glob(f".*{TEMPORARY_SUFFIX}") if p.is_file()]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return [str(p) for p in leftovers]


def _entry_of(folder: RunStorage, path: str) -> str:
    return path[len(folder.path) :].lstrip("/").split("/", 1)[0]


def has_files(folder: RunStorage) -> bool:
    """Whether the run stored anything in the folder (the record of a start does not count)."""
    try:
        found = folder.fs.find(folder.path)
    except FileNotFoundError:
        return False
    return any(_entry_of(folder, f) not in _START_RECORD for f in found)


def _set_aside(folder: RunStorage) -> str:
    """Move what the run stored to ``<folder>.replaced-<time>`` (nothing is deleted); returns its URL.
    The record of the start under way stays (its logs are copied: they are open)."""
    target = f"{folder.path}.replaced-{dt.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}"
    folder.fs.makedirs(target, exist_ok=True)
    for entry in folder.fs.ls(folder.path, detail=False, refresh=True):
        name = _entry_of(folder, str(entry))
        if name in _APPENDED_LOGS:
            folder.fs.cp_file(entry, f"{target}/{name}")
        elif name not in _START_RECORD:
            folder.fs.mv(entry, f"{target}/{name}", recursive=True)
    return folder.url_of_path(target)


def _later_version(storage: RunStorage, code: dict[str, Any]) -> RunStorage | None:
    """The identity's folder of a later code version that completed with this code and these settings
    (an unfinished version that continued with them, and finished), else the unfinished one started last."""
    parent = storage.path.rpartition("/")[0]
    try:
        names = [
            str(n).rstrip("/").rpartition("/")[2] for n in storage.fs.ls(parent, detail=False, refresh=True)
        ]
    except FileNotFoundError:
        return None
    pattern = re.compile(re.escape(storage.identity) + "-[0-9a-f]{8}")
    unfinished = []
    for name in sorted(n for n in names if pattern.fullmatch(n)):
        folder = RunStorage(storage.root, name, storage.options)
        record = _read_json(folder, _RECORD)
        if _completed(_read_json(folder, "summary.json")):
            if _trained_the_same(record, code):
                return folder
        elif has_files(folder):
            unfinished.append((str(((record.get("starts") or [{}])[-1]).get("at") or ""), folder))
    return max(unfinished, key=lambda found: found[0])[1] if unfinished else None


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
    """Point a resumed run's TensorBoard at the run's log directory, so its curves continue: the one
    run.json recorded, on the machine that started the run; elsewhere this run's own, where the event
    files copied into the storage folder (``storage.copy_logs``) are restored."""
    if own_dir is None or decision.point is None:
        decision.tensorboard_dir = own_dir
        return
    previous = decision.tensorboard_dir
    if previous is not None and previous.is_dir():
        log.info("resume: TensorBoard continues in %s", previous)
        return
    try:
        listed = storage.fs.ls(f"{storage.path}/tensorboard", detail=True)  # find() would hide an OSError
        events = [e["name"] for e in listed if e["type"] == "file"]
    except FileNotFoundError:
        events = []
    own_dir.mkdir(parents=True, exist_ok=True)
    for event in events:
        storage.fs.get_file(event, str(own_dir / event.rsplit("/", 1)[-1]))
    if events:
        log.info("resume: restored %d TensorBoard event file(s) from %s", len(events), storage.url)
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
    record = _read_json(storage, _RECORD)
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
    storage.write_text(_RECORD, json.dumps(record, indent=2) + "\n")


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
