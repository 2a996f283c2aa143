"""What a backend holds on one rank: the memory description every backend gives as ``Backend.memory``.

``study.memory.MemoryModel`` counts a case's memory per rank term by term; for
the terms that depend on the backend (the output's element size, its working
memory, the gradients as it holds them, the backward's working memory, and
whether a plan counts them on a GPU) it asks the backend's description, one of
the classes below or a backend module's own subclass. None of them imports CuPy
or torch: a plan runs on a login node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hilbert_hpc.core.patterns import Pattern

if TYPE_CHECKING:
    from hilbert_hpc.kernels.selection import KernelChoice

#: blockwise backends: a score tile, its probabilities and one temporary of the same size
TILE_ARRAYS = 3


class Placed(Protocol):
    """What a memory description asks of its backend (``Backend``): where its arrays live and whether it runs
    here."""

    @property
    def on_gpu(self) -> bool: ...

    def usable(self) -> str | None: ...


@dataclass(frozen=True)
class RankShape:
    """One rank's part of a case, what a backend's memory depends on."""

    #: tokens per rank
    shard: int
    heads: int
    head_dim: int
    #: bytes per element of the case's dtype
    itemsize: int
    patterns: tuple[Pattern, ...]
    #: batch elements (each with its own Q, K, V, O)
    batch: int = 1
    #: the ranks the case runs on
    ranks: int = 1
    #: the forward kernel the rank runs (``CaseSetup.kernel``), None: no kernels of the backend's own
    kernel: KernelChoice | None = None

    @property
    def row(self) -> int:
        """Elements of one token's row over all heads."""
        return self.heads * self.head_dim

    @property
    def acc_itemsize(self) -> int:
        """Bytes per element of the accumulator dtype (at least float32)."""
        return max(self.itemsize, 4)


class BackendMemory:
    """The memory description of a backend computing in at least float32 with kernels or the array-module
    algorithm that work in place or in bounded tiles: the defaults every description starts from."""

    def output_itemsize(self, itemsize: int) -> int:
        """Bytes per element of the output for inputs of ``itemsize`` bytes (default: at least float32)."""
        return max(itemsize, 4)

    def qkvo_bytes(self, shape: RankShape) -> int:
        """Q, K, V and the output of every batch element of the rank's shard: the floor no backend goes below."""
        return shape.batch * shape.shard * shape.row * (3 * shape.itemsize + self.output_itemsize(shape.itemsize))

    def workspace_bytes(self, shape: RankShape) -> int:
        """Working memory of the forward beyond Q, K, V, O, the log-sum-exp and the ring buffers (default: none)."""
        return 0

    def gradient_bytes(self, shape: RankShape) -> int:
        """dQ, dK, dV of the shard while the backward runs (default: in the accumulator dtype)."""
        return shape.shard * 3 * shape.row * shape.acc_itemsize

    def backward_workspace_bytes(self, shape: RankShape) -> int:
        """Working memory of the backward beyond dO, the gradients and rowsum(dO * O) (default: none; the
        kernels and the array-module algorithm work in place or in bounded tiles)."""
        return 0

    def counted_on_gpu(self, backend: Placed, gpu_nodes: bool | None) -> bool:
        """Whether a plan counts ``backend``'s memory on a GPU; ``gpu_nodes``: the plan is for GPU nodes (True),
        or for this machine (None). Default: where its arrays live (``Backend.on_gpu``)."""
        return backend.on_gpu


@dataclass(frozen=True)
class TiledMemory(BackendMemory):
    """The array-module algorithm: ``TILE_ARRAYS`` score tiles of ``tile`` elements, one set per core of the
    machine with ``per_core`` (the NumPy backend's threads)."""

    tile: int
    per_core: bool = False

    def workspace_bytes(self, shape: RankShape) -> int:
        """The score tiles in the accumulator dtype."""
        sets = (os.cpu_count() or 1) if self.per_core else 1
        return TILE_ARRAYS * self.tile * shape.acc_itemsize * sets
