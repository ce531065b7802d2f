"""torch's own view of this process's CUDA memory: allocated, reserved, peak per device.

These are host-side counters of torch's caching allocator: reading them never waits for the
GPU. torch is never imported and CUDA never initialised here; a process whose torch has not
started CUDA has nothing to report.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["TorchMemory", "cuda_in_use", "read"]


@dataclass(frozen=True)
class TorchMemory:
    """One device as torch sees it (``index`` counts the devices CUDA_VISIBLE_DEVICES shows)."""

    index: int
    uuid: str
    allocated: int
    reserved: int
    peak: int


def cuda_in_use() -> Any | None:
    """``torch.cuda`` if this process imported torch and started CUDA, else ``None``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    cuda = torch.cuda
    return cuda if cuda.is_initialized() else None


def _uuid(cuda: Any, index: int) -> str:
    uuid = str(getattr(cuda.get_device_properties(index), "uuid", ""))
    return uuid if not uuid or uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def read(cuda: Any) -> tuple[TorchMemory, ...]:
    """The memory counters of every device ``cuda`` (``torch.cuda``) knows."""
    return tuple(_device(cuda, index) for index in range(cuda.device_count()))


def _device(cuda: Any, index: int) -> TorchMemory:
    return TorchMemory(
        index,
        _uuid(cuda, index),
        int(cuda.memory_allocated(index)),
        int(cuda.memory_reserved(index)),
        int(cuda.max_memory_allocated(index)),
    )
