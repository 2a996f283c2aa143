"""What the distributed forward and backward compute with: one provider each, the only route to computation.

A provider holds the decisions of a case (kernel, dtypes) and answers the few
calls the ring, the gather schedule and the local patterns make. The forward's
are :class:`hilbert_hpc.distributed.ring.HostBlockForward` (any array module),
:class:`hilbert_hpc.kernels.launch.FusedKernels` (the FP32 kernels) and
:class:`hilbert_hpc.kernels.sixteen_bit.SixteenBitKernels`; the backward's
:class:`hilbert_hpc.distributed.ring_backward.HostBlockBackward` and
:class:`hilbert_hpc.kernels.backward.RingBackwardKernels`. A backend gives its
own through ``ring_kernels`` and ``ring_backward_kernels``.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

Array = Any


class ForwardProvider(Protocol):
    """The forward's compute: local patterns on the shard, packed ring blocks and gathered patterns, every result
    merged by log-sum-exp into the running output and log-sum-exp in place."""

    def accumulators(self, xp: Any, n: int, heads: int, dv: int, dtype: Any) -> tuple[Array, Array]:
        """The running output (n, H, Dv) at zero and log-sum-exp (n, H) at -inf."""

    def local_patterns(self, qs: Array, ks: Array, vs: Array, patterns: Sequence[Any], causal: bool,
                       scale: float, out: Array, lse: Array) -> None:
        """Patterns whose segments lie inside the shard."""

    def ring_block(self, qs: Array, block: Array, geom: Any, pos: int, src: int, pair: Any, scale: float,
                   out: Array, lse: Array) -> None:
        """This rank's queries of one piece against one piece of a packed ring block (``RingPattern``,
        ``PiecePair``)."""

    def gathered(self, qs: Array, sequence: Array, gather: Any, scale: float, out: Array, lse: Array) -> None:
        """This rank's queries against a gathered pattern's rows in sequence order (``GatherPattern``)."""


class BackwardProvider(Protocol):
    """The backward's compute: gradient terms of the local patterns, of packed ring blocks and of gathered
    patterns, from the merged log-sum-exp and ``delta = rowsum(dO * O)``."""

    def accumulator_dtype(self, dtype: Any) -> Any:
        """dtype of the gradients and of the terms that travel for inputs of ``dtype``."""

    def row_delta(self, dout: Array, out: Array) -> Array:
        """``rowsum(dO * O)`` (L, H) of the shard."""

    def local_backward(self, qs: Array, ks: Array, vs: Array, out: Array, lse: Array, dout: Array, delta: Array,
                       patterns: Sequence[Any], causal: bool, scale: float,
                       into: tuple[Array, Array, Array] | None = None) -> tuple[Array, Array, Array]:
        """dQ, dK, dV of the local patterns (zeros without any), added into ``into`` when given."""

    def ring_block(self, qs: Array, dout: Array, lse: Array, delta: Array, block: Array, partial: Array,
                   geom: Any, pos: int, src: int, pair: Any, scale: float, dq: Array) -> None:
        """Terms of one piece pair of a packed ring block: dQ into ``dq``, dK/dV into the block's ``partial``."""

    def gathered(self, qs: Array, dout: Array, lse: Array, delta: Array, sequence: Array, terms: Array,
                 gather: Any, scale: float, dq: Array) -> None:
        """Terms against a gathered pattern's rows: dQ into ``dq``, dK/dV into ``terms`` (sequence order)."""
