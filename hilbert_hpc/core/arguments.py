"""The checks and the geometry both public APIs share (:func:`hilbert_hpc.dilated_attention` on arrays,
:func:`hilbert_hpc.nn.dilated_attention` on torch tensors): argument misuse refused before any work, the
(B, N, H, D) view of the inputs, and the serialization order, patterns and scale of a problem.

Every check runs on every call, before anything is looked up in a cache, so that an answer never depends on
the calls made before it."""

from __future__ import annotations

import math
import sys
import warnings
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
    numbers, of one dtype; ``causal`` a bool; ``scale`` None or a finite number > 0.
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
            raise TypeError(f"{name}: has {NOT_REAL[kind]} dtype {_dtype(x)}; attention needs real numbers "
                            f"(float or integer)")
    dtypes = [_dtype_name(x) for x in (q, k, v)]
    for name, dtype in zip("kv", dtypes[1:]):
        if dtype != dtypes[0]:
            raise TypeError(f"{name}: has dtype {dtype}, but q has {dtypes[0]}: pass q, k and v in one dtype "
                            f"(convert them first, for example all to {dtypes[0]})")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal: expected True or False, got {causal!r}")
    if scale is not None:
        if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
            raise TypeError(f"scale: expected a number or None, got {scale!r}")
        finite = _finite(scale)
        if not finite or scale <= 0:
            shown = repr(scale) if finite is not None else f"an integer of {int(math.log10(abs(scale))) + 1} digits"
            raise ValueError(f"scale: expected a finite number > 0 (or None for 1/sqrt(D)), got {shown}")


def _finite(x: float | int) -> bool | None:
    """Whether a number is finite as a float; None for an integer beyond the float range."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return None


def _dtype(x: Any) -> Any:
    """The dtype of an array or tensor, or the one NumPy gives an array-like."""
    dtype = getattr(x, "dtype", None)
    return dtype if dtype is not None else np.asarray(x).dtype


def _dtype_name(x: Any) -> str:
    """The dtype's name as people write it: ``float32``, ``bfloat16`` (without torch's prefix)."""
    return str(_dtype(x)).removeprefix("torch.")


def _dtype_kind(x: Any) -> str:
    """NumPy's dtype kind of an array, tensor or array-like (``'b'`` for a torch bool, ``'c'`` for complex)."""
    from hilbert_hpc.core.arrays import is_tensor

    if is_tensor(x):
        return "c" if x.dtype.is_complex else "b" if x.dtype == sys.modules["torch"].bool else "f"
    return np.dtype(_dtype(x)).kind


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(getattr(x, "shape", ()))


def batch_view(q: Any, k: Any, v: Any) -> tuple[bool, tuple[Any, Any, Any]]:
    """Check the shapes of q, k, v (ConfigError naming the argument); return whether they are batched and
    their (B, N, H, D) views (a leading batch axis of 1 added to (N, H, D) inputs)."""
    ndim = getattr(q, "ndim", None)
    if ndim not in (3, 4):
        raise ConfigError(f"q must have shape (N, H, D) or (B, N, H, D), got {_shape(q)}", "q")
    for name, x in (("k", k), ("v", v)):
        if getattr(x, "ndim", None) != ndim:
            raise ConfigError(f"{name} has shape {_shape(x)}, but q has shape {_shape(q)}: q, k and v take one "
                              f"layout, all (N, H, D) or all (B, N, H, D)", name)
    batched = ndim == 4
    q4, k4, v4 = (x if batched else x[None] for x in (q, k, v))
    b, n, h, d = q4.shape
    for size, words in ((b, "an empty batch (B = 0)"), (n, "no tokens (N = 0)"), (h, "no heads (H = 0)")):
        if size == 0:
            raise ConfigError(f"q has shape {_shape(q)}, with {words}: it needs at least one", "q")
    if d == 0 or v4.shape[3] == 0:
        name, x = ("q", q) if d == 0 else ("v", v)
        raise ConfigError(f"{name} has shape {_shape(x)}, with an empty last (head) dimension: it needs at least "
                          f"one entry", name)
    if tuple(k4.shape) != (b, n, h, d):
        raise ConfigError(f"k has shape {_shape(k)}, expected {_shape(q)}", "k")
    if tuple(v4.shape[:3]) != (b, n, h):
        raise ConfigError(f"v has shape {_shape(v)}, expected leading dims {_shape(q)[:-1]}", "v")
    return batched, (q4, k4, v4)


def check_sequence(tokens: int, heads: int, batched: bool, patterns: Sequence[Pattern]) -> None:
    """Refuse patterns whose segment length does not divide the sequence length (ConfigError naming the pattern),
    saying which axis of q the sequence length is read from, and that a (B, H, N, D) input swaps the axes."""
    try:
        check_problem(tokens, patterns)
    except ConfigError as exc:
        layout, swapped = ("(B, N, H, D)", "(B, H, N, D)") if batched else ("(N, H, D)", "(H, N, D)")
        note = f"N, axis {int(batched)} of q: q, k and v take the layout {layout}"
        if all(heads % p.segment == 0 for p in patterns):
            note += f"; for q, k, v laid out {swapped}, swap their head and token axes"
        raise ConfigError(f"{exc.message} ({note})", exc.param) from None


def problem_arguments(tokens: int, heads: int, head_dim: int, batched: bool, patterns: Sequence,
                      grid: Sequence[int] | int | None, ordering: str, scale: float | None, segment: int | None
                      ) -> tuple[tuple[Pattern, ...], tuple[int, ...], str, int | None, float]:
    """Parse and check the patterns, grid, ordering and segment of a problem of ``tokens`` rows, ``heads`` heads
    (ConfigError naming the argument; a UserWarning for ``hilbert`` without a grid, the natural order); return
    the patterns, the grid, the ordering, its block length and the softmax scale (default 1/sqrt(D))."""
    pats = parse_patterns(patterns)
    dims = parse_grid(grid, tokens)
    check_sequence(tokens, heads, batched, pats)
    ordering, block = resolve_ordering(ordering, pats, segment, tokens)
    if ordering == "hilbert" and grid is None:
        warnings.warn(f"grid: ordering=\"hilbert\" without a grid orders the 1-D grid ({tokens},), whose Hilbert "
                      f"curve is the natural order; pass grid= the tokens' shape (for example (rows, columns)), or "
                      f"grid=({tokens},) to say that the natural order is meant", UserWarning,
                      stacklevel=_caller_level())
    return pats, dims, ordering, block, 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _caller_level() -> int:
    """The ``stacklevel`` of :func:`warnings.warn`, called by this function's caller, that names the first frame
    outside hilbert_hpc and torch: the user's call of the API."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("hilbert_hpc", "torch"):
        frame, level = frame.f_back, level + 1
    return level


def problem_geometry(tokens: int, heads: int, head_dim: int, batched: bool, patterns: Sequence,
                     grid: Sequence[int] | int | None, ordering: str, scale: float | None, segment: int | None
                     ) -> tuple[tuple[Pattern, ...], np.ndarray, float]:
    """:func:`problem_arguments`, checked; return the patterns, the serialization permutation and the scale."""
    pats, dims, ordering, block, scale = problem_arguments(tokens, heads, head_dim, batched, patterns, grid,
                                                           ordering, scale, segment)
    return pats, problem_order(dims, ordering, block), scale
