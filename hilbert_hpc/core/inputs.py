"""Counter-based random inputs: every value is a pure function of (seed, tensor, natural position).

So any rank count, any ordering and any subset of rows see exactly the same global
problem, and each rank generates only the rows it owns, without communication.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

#: the random streams: Q, K, V, and the loss gradient dO of a study's backward (stream 0)
STREAMS = {"do": 0, "q": 1, "k": 2, "v": 3}

#: seeds are ``0 .. MAX_SEED``: the key of (seed, tensor) is ``seed * 4 + stream`` in 64 bits, so a larger seed
#: would wrap around onto the key of a smaller one (0, 2**62 and 2**64 would give the same inputs)
MAX_SEED = (1 << 62) - 1

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: Any, xp: ModuleType) -> Any:
    """The SplitMix64 finalizer: a bijective 64-bit mixing function (element-wise)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(counters: Any, key: np.uint64, xp: ModuleType) -> Any:
    """Uniform doubles in (0, 1) from 53 random bits of each counter's hash."""
    bits = _splitmix64(counters ^ key, xp) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)


#: elements generated per chunk (bounds the float64 temporaries of ``random_rows``)
CHUNK_ELEMENTS = 1 << 24


def _random_block(key: np.uint64, positions: Any, heads: int, head_dim: int, dtype: Any, xp: ModuleType) -> Any:
    with np.errstate(over="ignore"):
        pos = xp.asarray(positions, dtype=np.uint64).reshape(-1, 1, 1)
        h = xp.arange(heads, dtype=np.uint64).reshape(1, -1, 1)
        d = xp.arange(head_dim, dtype=np.uint64).reshape(1, 1, -1)
        counter = ((pos * np.uint64(heads) + h) * np.uint64(head_dim) + d) * np.uint64(2)
        u1 = _uniform(counter, key, xp)
        u2 = _uniform(counter + np.uint64(1), key, xp)
    z = xp.sqrt(-2.0 * xp.log(u1)) * xp.cos((2.0 * np.pi) * u2)
    return z.astype(dtype)


def check_seed(seed: Any) -> int:
    """``seed`` as an int, or ValueError: an integer from 0 to :data:`MAX_SEED` (each gives its own inputs)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"seed must be from 0 to 2**62 - 1 ({MAX_SEED}), got {seed}: a larger or negative seed "
                         f"would repeat the inputs of another seed")
    return int(seed)


def random_rows(seed: int, tensor: str, positions: Any, heads: int, head_dim: int,
                dtype: Any = np.float32, xp: ModuleType = np) -> Any:
    """Standard-normal rows (len(positions), heads, head_dim) for natural token positions.

    ``tensor`` is ``"q"``, ``"k"``, ``"v"`` or ``"do"`` (a study's loss gradient). Box-Muller over two SplitMix64 streams
    keyed by (seed, tensor) (key ``seed * 4 + stream``, distinct for every seed
    from 0 to :data:`MAX_SEED`; other seeds raise ValueError); element (n, h, d)
    uses counter ``(n*heads + h)*head_dim + d``. ``xp`` (NumPy or CuPy) is where
    the rows are made; they are made in chunks of rows, so temporaries stay small
    however long the sequence.
    """
    seed = check_seed(seed)
    if tensor not in STREAMS:
        raise ValueError(f"tensor must be one of {', '.join(map(repr, STREAMS))}, got {tensor!r}")
    with np.errstate(over="ignore"):
        key = _splitmix64(np.uint64(seed) * np.uint64(4) + np.uint64(STREAMS[tensor]), np)
    positions = xp.asarray(positions, dtype=np.uint64).reshape(-1)
    n = positions.shape[0]
    step = max(1, CHUNK_ELEMENTS // (heads * head_dim))
    if n <= step:
        return _random_block(key, positions, heads, head_dim, dtype, xp)
    out = xp.empty((n, heads, head_dim), dtype=dtype)
    for start in range(0, n, step):
        out[start:start + step] = _random_block(key, positions[start:start + step], heads, head_dim, dtype, xp)
    return out


def random_qkv(seed: int, positions: Any, heads: int, head_dim: int, dtype: Any = np.float32,
               xp: ModuleType = np) -> tuple[Any, Any, Any]:
    """Q, K and V rows for the given natural positions (see ``random_rows``)."""
    return tuple(random_rows(seed, t, positions, heads, head_dim, dtype, xp) for t in ("q", "k", "v"))
