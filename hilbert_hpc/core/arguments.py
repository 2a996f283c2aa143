"""The checks and the geometry both public APIs share (:func:`hilbert_hpc.dilated_attention` on arrays,
:func:`hilbert_hpc.nn.dilated_attention` on torch tensors): argument misuse refused before any work, the
(B, N, H, D) view of the inputs, and the serialization order, patterns and scale of a problem."""

from __future__ import annotations

import math
import sys
from typing import Any, Sequence

import numpy as np

from hilbert_hpc.core.ordering import problem_order, resolve_ordering
from hilbert_hpc.core.patterns import Pattern, check_problem, parse_grid, parse_patterns
from hilbert_hpc.errors import ConfigError


#: dtype kinds that are not real numbers: booleans, complex numbers, objects, strings, dates
NOT_REAL = {"b": "boolean", "c": "complex", "O": "object", "S": "string", "U": "string", "M": "datetime",
            "m": "timedelta"}


def check_arguments(q: Any, k: Any, v: Any, causal: Any, scale: Any) -> None:
    """Refuse API misuse before any work: TypeError/ValueError naming the argument.

    q, k, v must be all torch tensors or all arrays (NumPy or array-like) of real
    numbers; ``causal`` a bool; ``scale`` None or a finite number > 0.
    """
    from hilbert_hpc.core.arrays import is_tensor

    tensors = [name for name, x in zip("qkv", (q, k, v)) if is_tensor(x)]
    if tensors and len(tensors) < 3:
        odd = next(name for name in "qkv" if name not in tensors)
        kind = type((q, k, v)["qkv".index(odd)])
        raise TypeError(f"{odd}: is a {kind.__module__.split('.')[0]}.{kind.__name__}, but {', '.join(tensors)} "
                        f"{'is a torch tensor' if len(tensors) == 1 else 'are torch tensors'}: pass q, k and v as the "
                        f"same kind (all torch tensors or all NumPy arrays)")
    for name, x in zip("qkv", (q, k, v)):
        kind = _dtype_kind(x)
        if kind in NOT_REAL:
            raise TypeError(f"{name}: has {NOT_REAL[kind]} dtype {x.dtype}; attention needs real numbers "
                            f"(float or integer)")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal: expected True or False, got {causal!r}")
    if scale is not None:
        if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
            raise TypeError(f"scale: expected a number or None, got {scale!r}")
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale: expected a finite number > 0 (or None for 1/sqrt(D)), got {scale!r}")


def _dtype_kind(x: Any) -> str:
    """NumPy's dtype kind of an array, tensor or array-like (``'b'`` for a torch bool, ``'c'`` for complex)."""
    from hilbert_hpc.core.arrays import is_tensor

    if is_tensor(x):
        return "c" if x.dtype.is_complex else "b" if x.dtype == sys.modules["torch"].bool else "f"
    dtype = getattr(x, "dtype", None)
    return np.dtype(dtype).kind if dtype is not None else np.asarray(x).dtype.kind


def batch_view(q: Any, k: Any, v: Any) -> tuple[bool, tuple[Any, Any, Any]]:
    """Check the shapes of q, k, v (ConfigError naming the argument); return whether they are batched and
    their (B, N, H, D) views (a leading batch axis of 1 added to (N, H, D) inputs)."""
    batched = getattr(q, "ndim", None) == 4
    if getattr(q, "ndim", None) not in (3, 4):
        raise ConfigError(f"q must have shape (N, H, D) or (B, N, H, D), got {tuple(getattr(q, 'shape', ()))}", "q")
    q4, k4, v4 = (x if batched else x[None] for x in (q, k, v))
    b, n, h, d = q4.shape
    if d == 0 or v4.shape[3] == 0:
        name, x = ("q", q) if d == 0 else ("v", v)
        raise ConfigError(f"{name} has shape {tuple(x.shape)}, with an empty last (head) dimension: it needs at least "
                          f"one entry", name)
    if tuple(k4.shape) != (b, n, h, d):
        raise ConfigError(f"k has shape {tuple(k.shape)}, expected {tuple(q.shape)}", "k")
    if tuple(v4.shape[:3]) != (b, n, h):
        raise ConfigError(f"v has shape {tuple(v.shape)}, expected leading dims {tuple(q.shape[:-1])}", "v")
    return batched, (q4, k4, v4)


def problem_geometry(tokens: int, head_dim: int, patterns: Sequence, grid: Sequence[int] | int | None,
                     ordering: str, scale: float | None, segment: int | None
                     ) -> tuple[tuple[Pattern, ...], np.ndarray, float]:
    """Parse and check the patterns, grid and ordering of a problem of ``tokens`` rows (ConfigError naming the
    argument); return the patterns, the serialization permutation and the softmax scale (default 1/sqrt(D))."""
    pats = parse_patterns(patterns)
    dims = parse_grid(grid, tokens)
    check_problem(tokens, pats)
    ordering, seg = resolve_ordering(ordering, pats, segment)
    perm = problem_order(dims, ordering, seg)
    return pats, perm, 1.0 / math.sqrt(head_dim) if scale is None else scale
