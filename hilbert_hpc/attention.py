"""Public single-process API: ``dilated_attention`` on natural-order inputs."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hilbert_hpc.core.arguments import batch_view, check_arguments, problem_geometry
from hilbert_hpc.core.arrays import tensor_to_numpy
from hilbert_hpc.backends import get_backend
from hilbert_hpc.core.ordering import inverse_order


def dilated_attention(q: Any, k: Any, v: Any, *, patterns: Sequence, causal: bool = False,
                      grid: Sequence[int] | int | None = None, ordering: str = "natural",
                      scale: float | None = None, backend: str | None = None, segment: int | None = None) -> Any:
    """Hilbert-ordered (or natural) dilated attention, exactly as docs/semantics.md defines it.

    ``q``, ``k``, ``v``: arrays of one dtype, all of shape (N, H, D) or all of
    shape (B, N, H, D), in natural order (row-major over ``grid``; default grid
    ``(N,)``); a (B, H, N, D) array needs its head and token axes swapped first.
    ``patterns``: list of ``(segment, dilation)``; every pattern acts on every
    head with offset ``h mod dilation``. ``ordering``: ``natural``, ``hilbert``
    or ``hilbert-segment``, whose block length ``segment`` (a positive integer
    dividing N; default the shortest pattern segment) no other ordering takes.
    ``hilbert`` without a ``grid`` warns (UserWarning): the Hilbert curve of the
    1-D grid ``(N,)`` is the natural order; ``grid=(N,)`` says that this is meant.
    Returns the output in natural order, same leading shape,
    as a NumPy array (the accumulator dtype: float32 or float64) — or a torch
    tensor when the inputs are tensors. ``backend``: where it is computed (a
    backend name; None: ``numpy`` for arrays and CPU tensors, while CUDA tensors
    are computed on their GPU by :func:`hilbert_hpc.nn.dilated_attention`, the
    result staying there; a backend named for CUDA tensors copies them to the host
    and returns a CPU tensor).

    Misuse raises before any work, naming the argument: TypeError for q, k, v
    mixing torch tensors with arrays, complex or boolean values, q, k, v of
    different dtypes, a ``causal`` that is not a bool or a ``scale`` that is not
    a number; ValueError (``ConfigError``) for shapes (q, k, v batched and not,
    an empty batch, token, head or head dimension axis), patterns, grid,
    ordering and segment, and a ``scale`` that is not finite and > 0. The
    answer to a call never depends on the calls made before it.
    """
    check_arguments(q, k, v, causal, scale)
    if backend is None and getattr(getattr(q, "device", None), "type", None) == "cuda":
        from hilbert_hpc import nn

        return nn.dilated_attention(q, k, v, patterns=patterns, causal=causal, grid=grid, ordering=ordering,
                                    scale=scale, segment=segment)
    be = get_backend(backend or "numpy")
    is_tensor = type(q).__module__.startswith("torch")
    if not is_tensor:
        q, k, v = (np.asarray(x) for x in (q, k, v))
    batched, (q4, k4, v4) = batch_view(q, k, v)
    b, n, h, d = q4.shape
    pats, perm, scale = problem_geometry(n, h, d, batched, patterns, grid, ordering, scale, segment)

    host = [tensor_to_numpy(x) if is_tensor else np.asarray(x) for x in (q4, k4, v4)]
    dtype = np.float64 if host[0].dtype == np.float64 else np.float32
    inverse = inverse_order(perm)
    outs = []
    for i in range(b):
        qs, ks, vs = (be.to_device(x[i][perm], dtype) for x in host)
        out_s = be.to_numpy(be.serialized_attention(qs, ks, vs, pats, causal, scale))
        outs.append(out_s[inverse])
    res = np.stack(outs)
    if is_tensor:
        import torch

        res = torch.from_numpy(res)
    return res if batched else res[0]
