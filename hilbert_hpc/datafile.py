"""Inputs from HDF5 files (natural order), redistributed to serialized shards in parallel.

Format (docs in ``data/README.md``): datasets ``q``, ``k``, ``v`` of shape
``(N, H, D)`` or ``(B, N, H, D)`` (``v`` may have its own last dimension), any
float dtype, tokens in natural (row-major grid) order; optional attribute
``grid`` on the root. Rank ``p`` reads only the contiguous natural block
``[p*L, (p+1)*L)``, then one ``Alltoallv`` sends every row to the rank that owns
its serialized position; no rank reads or holds the whole sequence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError
from .sharding import Layout

TENSORS = ("q", "k", "v")


def describe_input(path: str | Path, param: str = "input") -> dict[str, Any]:
    """Shape facts of an input file: ``{batch, tokens, heads, head_dim, v_dim, grid}``; clear errors otherwise."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot open input file {str(path)!r} as HDF5 ({exc})", param) from None
    with f:
        missing = [t for t in TENSORS if t not in f]
        if missing:
            raise ConfigError(f"input file {str(path)!r} lacks dataset(s) {', '.join(missing)}", param)
        shapes = {t: f[t].shape for t in TENSORS}
        q = shapes["q"]
        if len(q) not in (3, 4) or shapes["k"] != q or shapes["v"][:-1] != q[:-1]:
            raise ConfigError(f"input file {str(path)!r}: q, k, v must be (N, H, D) or (B, N, H, D) with equal "
                              f"leading dims, got {shapes}", param)
        grid = tuple(int(g) for g in f.attrs["grid"]) if "grid" in f.attrs else None
    batched = len(q) == 4
    return {"batch": q[0] if batched else 1, "tokens": q[-3], "heads": q[-2], "head_dim": q[-1],
            "v_dim": shapes["v"][-1], "grid": grid, "batched": batched}


def read_rows(path: str | Path, tensor: str, batch_index: int, natural: np.ndarray, dtype: Any) -> np.ndarray:
    """Rows ``natural`` (any order, repeats allowed) of one tensor, read with sorted unique selections."""
    import h5py

    uniq, inverse = np.unique(np.asarray(natural, dtype=np.int64), return_inverse=True)
    with h5py.File(path, "r") as f:
        ds = f[tensor]
        rows = ds[batch_index, uniq] if ds.ndim == 4 else ds[uniq]
    return np.asarray(rows, dtype=dtype)[inverse]


def read_shard(path: str | Path, tensor: str, batch_index: int, layout: Layout, comm: Any, dtype: Any) -> np.ndarray:
    """This rank's serialized shard of ``tensor``: contiguous natural read + one all-to-all exchange."""
    import h5py

    rank, ranks, shard = comm.Get_rank(), comm.Get_size(), layout.shard
    lo, hi = rank * shard, (rank + 1) * shard
    with h5py.File(path, "r") as f:
        ds = f[tensor]
        block = np.asarray(ds[batch_index, lo:hi] if ds.ndim == 4 else ds[lo:hi], dtype=dtype)
    serial = layout.serialized_of(np.arange(lo, hi, dtype=np.int64))
    return redistribute(block, serial, shard, comm)


def redistribute(rows: np.ndarray, targets: np.ndarray, shard: int, comm: Any) -> np.ndarray:
    """Rows go to the positions ``targets`` of a global index split into blocks of ``shard``; returns
    this rank's block (rows of positions ``rank*shard ..``), by one all-to-all exchange.

    Serialized -> natural for outputs, natural -> serialized for inputs: every rank
    sends and receives only its own rows, nobody holds the whole sequence.
    """
    rank, ranks = comm.Get_rank(), comm.Get_size()
    lo = rank * shard
    dest = targets // shard
    order = np.argsort(dest, kind="stable")
    send_rows = np.ascontiguousarray(rows[order])
    send_pos = np.ascontiguousarray(targets[order]).astype(np.int64)
    send_counts = np.bincount(dest, minlength=ranks).astype(np.int64)
    out = np.empty((shard, *rows.shape[1:]), dtype=rows.dtype)
    if ranks == 1:
        out[send_pos - lo] = send_rows
        return out
    recv_counts = np.asarray(comm.alltoall(send_counts.tolist()), dtype=np.int64)
    row = int(np.prod(rows.shape[1:]))
    recv_pos = np.empty(int(recv_counts.sum()), dtype=np.int64)
    recv_rows = np.empty((int(recv_counts.sum()), *rows.shape[1:]), dtype=rows.dtype)
    comm.Alltoallv([send_pos, (send_counts, _displ(send_counts))], [recv_pos, (recv_counts, _displ(recv_counts))])
    comm.Alltoallv([send_rows.reshape(-1), (send_counts * row, _displ(send_counts) * row)],
                   [recv_rows.reshape(-1), (recv_counts * row, _displ(recv_counts) * row)])
    out[recv_pos - lo] = recv_rows
    return out


def _displ(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def write_input(path: str | Path, q: np.ndarray, k: np.ndarray, v: np.ndarray, grid: tuple[int, ...] | None = None) -> None:
    """Write natural-order Q, K, V in the input format (used to make ``data/`` files and by tests)."""
    import h5py

    with h5py.File(path, "w") as f:
        for name, x in zip(TENSORS, (q, k, v)):
            ds = f.create_dataset(name, data=x)
            ds.attrs["order"] = "natural"
            ds.attrs["axes"] = "token, head, dim" if x.ndim == 3 else "batch, token, head, dim"
        if grid is not None:
            f.attrs["grid"] = np.asarray(grid, dtype=np.int64)
