"""One device policy: the resources a worker was given decide where and in which precision every
model it loads runs.

- `num_gpus > 0` on the actor (or trial, or replica): the model goes to its GPU; without one it stays
  on the CPU, whatever the machine has (a CPU actor on a GPU node must not take the GPU).
- One precision vocabulary: `auto | float32 | bfloat16 | float16 | float64`. `auto` is float16
  weights for inference and float32 weights with bfloat16 autocast for training on a GPU, float32
  on a CPU. bfloat16 on a CPU is used only where the CPU has native bf16 (AVX512-BF16 or AMX):
  elsewhere one bf16 matmul took 66x the float32 time, so it falls back to float32 with a warning.
"""

from __future__ import annotations

import functools
import logging
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

from redline.errors import RedlineError

log = logging.getLogger(__name__)

Precision = Literal["auto", "float32", "bfloat16", "float16", "float64"]
PRECISIONS = ("auto", "float32", "bfloat16", "float16", "float64")
PRECISION_HELP = ("auto: float16 (inference) or bfloat16 autocast (training) on a GPU, float32 on a CPU; "
                  "bfloat16 on a CPU only with native bf16 (AVX512-BF16/AMX), else float32 with a warning.")


@functools.cache
def cpu_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (x86 AVX512-BF16 or AMX; Arm's BF16 extension)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = set(f.read().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


@dataclass(frozen=True)
class Placement:
    """Where a model runs: its device, the dtype its weights are loaded in, and the autocast dtype of
    its forward passes (None: none)."""

    device: str  # cpu | cuda
    dtype: str  # float32 | float16 | bfloat16 | float64
    autocast: str | None = None

    @property
    def torch_device(self) -> Any:
        import torch

        return torch.device(self.device)

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    def autocast_context(self) -> Any:
        """The forward passes' autocast (a no-op when there is none)."""
        if self.autocast is None:
            return nullcontext()
        import torch

        return torch.autocast(self.device, dtype=getattr(torch, self.autocast))


def to_device(tensor: Any, device: Any) -> Any:
    """A host tensor on `device`; towards a GPU through pinned memory, so the copy overlaps the GPU's work."""
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)


_WARNED: set[str] = set()


def placement(num_gpus: float, precision: str = "auto", *, training: bool = False) -> Placement:
    """The placement of a model loaded by a worker that was given `num_gpus` GPUs."""
    if precision not in PRECISIONS:
        raise RedlineError(f"unknown precision '{precision}' ({', '.join(PRECISIONS)})")
    device = "cpu"
    if num_gpus > 0:
        import torch

        if not torch.cuda.is_available():
            raise RedlineError(f"this worker was given num_gpus={num_gpus:g} but torch sees no CUDA device "
                               "(a CPU build of torch, or no GPU on this node)")
        device = "cuda"
    if precision == "auto":
        if device == "cuda":
            return Placement("cuda", "float32", "bfloat16") if training else Placement("cuda", "float16")
        return Placement("cpu", "float32")
    if device == "cpu" and precision == "bfloat16" and not cpu_native_bf16():
        _warn_once("precision bfloat16 asked for on a CPU without native bf16 (AVX512-BF16/AMX), where it runs "
                   "tens of times slower than float32: using float32")
        return Placement("cpu", "float32")
    if device == "cpu" and precision == "float16":
        _warn_once("precision float16 asked for on a CPU, which has no fast float16 arithmetic: using float32")
        return Placement("cpu", "float32")
    if training and precision in ("bfloat16", "float16"):
        return Placement(device, "float32", precision)  # float32 master weights, half-precision forward
    return Placement(device, precision)
