"""The callbacks litlab builds, run by Lightning as one: Lightning hands every hook to every callback,
``CombinedCallbacks`` only to the parts that define it (what it saves: docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import (
    BatchSizeFinder,
    Callback,
    Checkpoint,
    EarlyStopping,
    LearningRateFinder,
    ProgressBar,
)
from lightning.pytorch.utilities.model_helpers import is_overridden

from litlab.callbacks.progress import PlainProgress

# Every hook Lightning hands to callbacks (state_dict and load_state_dict are CombinedCallbacks' own).
HOOKS = [name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown")]
# Kinds Lightning finds in trainer.callbacks by type, or runs after the others: kept separate.
_LOOKED_FOR_BY_TYPE = (Checkpoint, ProgressBar, EarlyStopping, BatchSizeFinder, LearningRateFinder)


def combinable(callback: Callback) -> bool:
    """Whether ``callback`` is litlab's or Lightning's and can run inside CombinedCallbacks. PlainProgress
    is a ProgressBar only so that Lightning's tuners silence it; litlab's batch-size finder does that."""
    package = type(callback).__module__.split(".")[0]
    if package not in ("litlab", "lightning") or getattr(callback, "after_your_callbacks", False):
        return False
    return isinstance(callback, PlainProgress) or not isinstance(callback, _LOOKED_FOR_BY_TYPE)


def combine(callbacks: Sequence[Callback]) -> list[Callback]:
    """``callbacks`` with the combinable ones as one CombinedCallbacks, where the first of them was.
    A callback that must run after yours (``after_your_callbacks``) joins as the last part when no
    other callback would run outside it, checkpoints aside: Lightning runs those after all others."""
    after = [callback for callback in callbacks if getattr(callback, "after_your_callbacks", False)]
    others = [callback for callback in callbacks if not any(callback is a for a in after)]
    parts = [callback for callback in others if combinable(callback)]
    if after and all(combinable(c) or isinstance(c, Checkpoint) for c in others):
        parts += after
    if len(parts) < 2:
        return list(callbacks)
    combined: list[Callback] = []
    for callback in callbacks:
        if not any(callback is part for part in parts):
            combined.append(callback)
        elif callback is parts[0]:
            combined.append(CombinedCallbacks(parts))
    return combined


def parts_of(callbacks: Sequence[Callback]) -> list[Callback]:
    """Every callback in ``callbacks``, with CombinedCallbacks replaced by their parts."""
    return [part for c in callbacks for part in (c.parts if isinstance(c, CombinedCallbacks) else [c])]


class CombinedCallbacks(Callback):
    """Callbacks as one; the parts' states are kept under their own state keys, inside this one's."""

    def __init__(self, parts: Sequence[Callback]) -> None:
        self.parts = list(parts)
        self._stateful = [part for part in self.parts if is_overridden("state_dict", part, Callback)]
        keys = [part.state_key for part in self._stateful]
        if len(set(keys)) != len(keys):
            raise RuntimeError(f"callbacks with the same state key cannot be combined: {keys}")
        self._calls: dict[str, tuple[Callable[..., Any], ...]] = {
            hook: tuple(getattr(part, hook) for part in self.parts if is_overridden(hook, part, Callback))
            for hook in HOOKS
        }

    def state_dict(self) -> dict[str, Any]:
        return {part.state_key: part.state_dict() for part in self._stateful}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part in self._stateful:
            if part.state_key in state_dict:
                part.load_state_dict(state_dict[part.state_key])

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # A checkpoint written before the parts ran combined has their states under their own keys.
        states = checkpoint.get("callbacks") or {}
        if self.state_key not in states:
            self.load_state_dict({key: value for key, value in states.items() if isinstance(key, str)})
        for call in self._calls["on_load_checkpoint"]:
            call(trainer, pl_module, checkpoint)


def _forwarder(hook: str) -> Callable[..., None]:
    def forward(self: CombinedCallbacks, *args: Any, **kwargs: Any) -> None:
        for call in self._calls[hook]:
            call(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = hook
    return forward


for _hook in HOOKS:
    if _hook not in vars(CombinedCallbacks):  # on_load_checkpoint has its own
        setattr(CombinedCallbacks, _hook, _forwarder(_hook))
