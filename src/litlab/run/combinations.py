"""Which accelerator x strategy x precision combinations this machine can run, said in one line: before
Lightning builds the Trainer (``check_combination``), or as Lightning refuses one (``trainer_errors``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from omegaconf import DictConfig

from litlab.errors import LitlabError, check_gpus_available, one_line

# What Lightning's accelerator names run on.
_DEVICE_OF = {"gpu": "cuda", "cuda": "cuda", "mps": "mps", "tpu": "tpu", "cpu": "cpu"}
_NEEDS = {"mps": "an Apple GPU (MPS)", "tpu": "a TPU and torch_xla (pip install torch_xla)"}


@functools.cache  # the hardware does not change while a process runs
def available_devices() -> frozenset[str]:
    """The device kinds here: ``cpu`` always, and ``cuda``, ``mps``, ``tpu`` as Lightning sees them."""
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator, XLAAccelerator

    found = {"cpu"}
    for device, accelerator in (("cuda", CUDAAccelerator), ("mps", MPSAccelerator), ("tpu", XLAAccelerator)):
        with contextlib.suppress(Exception):  # an accelerator's check may import what is not installed
            if accelerator.is_available():
                found.add(device)
    return frozenset(found)


def check_combination(trainer: DictConfig, strategy: DictConfig) -> None:
    """A LitlabError (one line) when this machine cannot run the trainer's accelerator, or the strategy
    on it (every precision builds on every accelerator: fp16 runs as bf16 on a CPU, with a warning)."""
    accelerator = str(trainer.get("accelerator", "auto"))
    check_gpus_available(trainer)
    available = available_devices()
    # What the accelerator runs on here (``auto`` picks as Lightning does: TPU, MPS, CUDA, CPU).
    auto = next((d for d in ("tpu", "mps", "cuda") if d in available), "cpu")
    device = auto if accelerator == "auto" else _DEVICE_OF.get(accelerator, accelerator)
    if device in _NEEDS and device not in available:
        raise LitlabError(
            f"trainer.accelerator={accelerator} needs {_NEEDS[device]}, which this machine does not have: "
            "use trainer.accelerator=cpu (or auto)"
        )
    start_method = strategy.get("start_method")
    if start_method in ("spawn", "forkserver"):  # the ranks' progress never reaches summary.json
        raise LitlabError(
            f"strategy.start_method={start_method} is not supported: the process that writes summary.json "
            "would see none of its ranks' steps; use strategy=ddp (start_method popen) or, in a notebook, "
            "strategy=ddp_notebook (fork)"
        )
    if strategy.name == "fsdp" and device != "cuda":
        raise LitlabError(
            f"strategy=fsdp needs GPUs (trainer.accelerator=gpu), and trainer.accelerator={accelerator} runs "
            f"on {device} here: use strategy=ddp with trainer.devices=N (or strategy=auto), or run on GPUs "
            "with trainer=gpu strategy=fsdp"
        )


@contextlib.contextmanager
def trainer_errors(trainer: DictConfig, strategy: DictConfig, precision: DictConfig) -> Iterator[None]:
    """What Lightning refuses while it builds the Trainer, as one line naming the combination."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        yield
    except (ValueError, MisconfigurationException, ImportError) as error:
        options = (
            f"trainer.accelerator={trainer.get('accelerator', 'auto')} strategy={strategy.name} "
            f"precision={precision.name}"
        )
        raise LitlabError(
            f"{options} cannot run here: {one_line(error)} (use trainer.accelerator=cpu strategy=auto "
            "precision=fp32, which run anywhere, or the options this names)"
        ) from error
