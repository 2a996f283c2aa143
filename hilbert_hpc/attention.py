"""Public single-process API: ``dilated_attention`` on natural-order inputs."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .backends import get_backend
from .errors import ConfigError
from .ordering import ORDERINGS, inverse_order, serialization_order
from .patterns import Pattern, check_problem, parse_grid, parse_patterns


def resolve_ordering(ordering: str, patterns: Sequence[Pattern], segment: int | None = None) -> tuple[str, int | None]:
    """Validate ``ordering``; the per-segment order folds the shortest pattern segment unless told otherwise."""
    if ordering not in ORDERINGS:
        raise ConfigError(f"unknown ordering {ordering!r}; choose one of {', '.join(ORDERINGS)}", "ordering")
    if ordering == "hilbert-segment":
        return ordering, segment or min(p.segment for p in patterns)
    return ordering, None


def problem_order(grid: Sequence[int], ordering: str, segment: int | None) -> np.ndarray:
    """The serialization permutation, with parameter errors turned into ConfigErrors."""
    try:
        return serialization_order(tuple(grid), ordering, segment=segment)
    except ValueError as exc:
        raise ConfigError(str(exc), "ordering") from None


def dilated_attention(q: Any, k: Any, v: Any, *, patterns: Sequence, causal: bool = False,
                      grid: Sequence[int] | int | None = None, ordering: str = "natural",
                      scale: float | None = None, backend: str = "numpy", segment: int | None = None) -> Any:
    """Hilbert-ordered (or natural) dilated attention, exactly as DESIGN section 2 defines it.

    ``q``, ``k``, ``v``: arrays of shape (N, H, D) or (B, N, H, D) in natural order
    (row-major over ``grid``; default grid ``(N,)``). ``patterns``: list of
    ``(segment, dilation)``; every pattern acts on every head with offset
    ``h mod dilation``. Returns the output in natural order, same leading shape,
    as a NumPy array (the accumulator dtype: float32 or float64) — or a torch
    tensor when the inputs are tensors and ``backend="torch"``.
    """
    be = get_backend(backend)
    batched = getattr(q, "ndim", None) == 4
    if getattr(q, "ndim", None) not in (3, 4):
        raise ConfigError(f"q must have shape (N, H, D) or (B, N, H, D), got {tuple(getattr(q, 'shape', ()))}", "q")
    q4, k4, v4 = (x if batched else x[None] for x in (q, k, v))
    b, n, h, d = q4.shape
    if tuple(k4.shape) != (b, n, h, d):
        raise ConfigError(f"k has shape {tuple(k.shape)}, expected {tuple(q.shape)}", "k")
    if tuple(v4.shape[:3]) != (b, n, h):
        raise ConfigError(f"v has shape {tuple(v.shape)}, expected leading dims {tuple(q.shape[:-1])}", "v")
    pats = parse_patterns(patterns)
    dims = parse_grid(grid, n)
    check_problem(n, pats)
    ordering, seg = resolve_ordering(ordering, pats, segment)
    perm = problem_order(dims, ordering, seg)
    if scale is None:
        scale = 1.0 / math.sqrt(d)

    is_tensor = type(q).__module__.startswith("torch")
    host = [x.detach().cpu().numpy() if is_tensor else np.asarray(x) for x in (q4, k4, v4)]
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
