"""Inputs from HDF5 files (natural order), redistributed to serialized shards in parallel.

Format (docs in ``data/README.md``): datasets ``q``, ``k``, ``v`` of shape
``(N, H, D)`` or ``(B, N, H, D)`` (``v`` may have its own last dimension), any
float or integer dtype, finite values, tokens in natural (row-major grid)
order; optional attribute ``grid`` on the root. Rank ``p`` reads only the contiguous natural block
``[p*L, (p+1)*L)``, then one ``Alltoallv`` sends every row to the rank that owns
its serialized position; no rank reads or holds the whole sequence.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from hilbert_hpc.errors import ConfigError
from hilbert_hpc.distributed.mpi import agree
from hilbert_hpc.distributed.sharding import Layout

TENSORS = ("q", "k", "v")


def describe_input(path: str | Path, param: str = "input") -> dict[str, Any]:
    """Shape facts of an input file: ``{batch, tokens, heads, head_dim, v_dim, grid}``; clear errors otherwise.

    Refuses (ConfigError naming the file and dataset): missing ``q``/``k``/``v``
    or ones that are not datasets, values that are not real numbers (only float
    and integer dtypes), shapes that do not match, zero-length axes, and a
    ``grid`` attribute that is not a 1-D list of positive integers with product N.
    """
    import h5py

    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot open input file {str(path)!r} as HDF5 ({exc})", param) from None
    with f:
        missing = [t for t in TENSORS if t not in f]
        if missing:
            raise ConfigError(f"input file {str(path)!r} lacks dataset(s) {', '.join(missing)}", param)
        for t in TENSORS:
            _check_dataset(_open_member(f, t, path, param), t, path, param)
        shapes = {t: f[t].shape for t in TENSORS}
        q = shapes["q"]
        if len(q) not in (3, 4) or shapes["k"] != q or shapes["v"][:-1] != q[:-1]:
            raise ConfigError(f"input file {str(path)!r}: q, k, v must be (N, H, D) or (B, N, H, D) with equal "
                              f"leading dims, got {shapes}", param)
        for t in TENSORS:
            _check_extents(shapes[t], t, path, param)
        grid = _grid_attribute(f.attrs["grid"], q[-3], path, param) if "grid" in f.attrs else None
    batched = len(q) == 4
    return {"batch": q[0] if batched else 1, "tokens": q[-3], "heads": q[-2], "head_dim": q[-1],
            "v_dim": shapes["v"][-1], "grid": grid, "batched": batched}


def _open_member(f: Any, tensor: str, path: str | Path, param: str) -> Any:
    """``f[tensor]``, with a link that does not resolve (an external link to a missing file) refused in one line."""
    import h5py

    try:
        return f[tensor]
    except (KeyError, OSError) as exc:
        link = f.get(tensor, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            what = f"an external link to {link.path!r} in {link.filename!r}, which cannot be opened"
        elif isinstance(link, h5py.SoftLink):
            what = f"a soft link to {link.path!r}, which does not exist"
        else:
            what = f"an object that cannot be opened ({_h5_reason(exc)})"
        raise ConfigError(f"input file {str(path)!r}: {tensor} is {what}: store {tensor} in the file itself, "
                          f"or make the link resolve", param) from None


def _h5_reason(exc: Exception) -> str:
    """The cause HDF5 gave, in a few words (h5py prefixes it with the call that failed)."""
    text = " ".join(str(exc).strip("'\"").split())
    return text.split("(", 1)[1].rstrip(")") if "(" in text else text or type(exc).__name__


def _read_block(path: str | Path, tensor: str, batch_index: int, rows: Any, param: str) -> np.ndarray:
    """Rows ``rows`` (a slice or sorted indices) of batch element ``batch_index`` of one dataset, as stored.

    Data that fails its checksum (fletcher32), a damaged compressed chunk, a
    link that no longer resolves or a file that went away become one
    ConfigError naming the file and dataset instead of an h5py traceback.
    """
    import h5py

    try:
        with h5py.File(path, "r") as f:
            ds = _open_member(f, tensor, path, param)
            return ds[batch_index, rows] if ds.ndim == 4 else ds[rows]
    except (OSError, KeyError, RuntimeError) as exc:
        reason = _h5_reason(exc)
        hint = (" (its data fails the HDF5 checksum or a compressed chunk is damaged)"
                if "filter" in reason.lower() else "")
        raise ConfigError(f"input file {str(path)!r}: cannot read dataset {tensor}: {reason}{hint}; "
                          f"fix or recreate the file", param) from None


def _check_dataset(obj: Any, tensor: str, path: str | Path, param: str) -> None:
    """Refuse a ``q``/``k``/``v`` that is not a dataset of real numbers (float or integer dtype)."""
    import h5py

    if not isinstance(obj, h5py.Dataset):
        kind = "a group" if isinstance(obj, h5py.Group) else f"a {type(obj).__name__}"
        raise ConfigError(f"input file {str(path)!r}: {tensor} is {kind}, not a dataset: store {tensor} as an array "
                          f"of shape (N, H, D) or (B, N, H, D)", param)
    if obj.shape is None:
        raise ConfigError(f"input file {str(path)!r}: dataset {tensor} is empty (no dataspace): store an array of "
                          f"shape (N, H, D) or (B, N, H, D)", param)
    dtype = obj.dtype
    if dtype.kind not in "fiu":
        what = {"c": "complex", "b": "boolean", "S": "string", "U": "string", "O": "object (or variable-length)",
                "V": "compound (or opaque)"}.get(dtype.kind, "non-numeric")
        raise ConfigError(f"input file {str(path)!r}: dataset {tensor} has {what} dtype {dtype}, not real numbers: "
                          f"store float or integer values", param)


def _check_extents(shape: tuple[int, ...], tensor: str, path: str | Path, param: str) -> None:
    """Refuse a dataset with a zero-length axis (no batch, no tokens, no heads or an empty head dimension)."""
    axes = ("batch", "tokens", "heads", "head_dim")[-len(shape):]
    for axis, extent in zip(axes, shape):
        if extent == 0:
            raise ConfigError(f"input file {str(path)!r}: dataset {tensor} has shape {shape}, with {axis} = 0: "
                              f"every axis needs at least one entry", param)


def _grid_attribute(value: Any, tokens: int, path: str | Path, param: str) -> tuple[int, ...]:
    """The root ``grid`` attribute as a tuple: a 1-D list of positive integers whose product is N."""
    grid = np.asarray(value)
    if grid.ndim != 1 or grid.size == 0 or grid.dtype.kind not in "iu" or (grid < 1).any():
        raise ConfigError(f"input file {str(path)!r}: root attribute grid = {value!r} is not a 1-D list of positive "
                          f"integers: store it as an integer array such as [32, 32], or delete it", param)
    dims = tuple(int(g) for g in grid)
    if math.prod(dims) != tokens:
        raise ConfigError(f"input file {str(path)!r}: root attribute grid = {list(dims)} has product "
                          f"{math.prod(dims)}, but q, k, v hold N = {tokens} tokens: fix the attribute", param)
    return dims


NATURAL_AXES = "(batch, token, head, dim)"


def _as_dtype(raw: np.ndarray, dtype: Any) -> np.ndarray:
    """``raw`` in the compute dtype, quietly: values that overflow become inf and are reported by the caller."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(raw, dtype=dtype)


def _first_bad(values: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first non-finite entry of ``values`` (C order), or None when every entry is finite."""
    finite = np.isfinite(values)
    if finite.all():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmin(finite.reshape(-1))), values.shape))


def _not_finite(path: str | Path, tensor: str, index: tuple[int, ...], raw: Any, dtype: Any,
                param: str) -> ConfigError:
    """The error for one non-finite input value at natural ``index`` (batch, token, head, dim)."""
    value = float(raw)
    what = (f"is {value}" if not np.isfinite(value)
            else f"= {value:g} overflows {np.dtype(dtype).name}")
    where = ", ".join(str(i) for i in index)
    return ConfigError(f"input file {str(path)!r}, dataset {tensor}: element [{where}] {NATURAL_AXES}, natural "
                       f"order, {what}: inputs must be finite numbers; fix the file", param)


def read_rows(path: str | Path, tensor: str, batch_index: int, natural: np.ndarray, dtype: Any,
              param: str = "input") -> np.ndarray:
    """Rows ``natural`` (any order, repeats allowed) of one tensor, read with sorted unique selections.

    Refuses non-finite values (ConfigError naming the file, tensor and natural
    index). Not collective: run it on rows that :func:`read_shard` has checked.
    """
    uniq, inverse = np.unique(np.asarray(natural, dtype=np.int64), return_inverse=True)
    raw = _read_block(path, tensor, batch_index, uniq, param)
    rows = _as_dtype(raw, dtype)
    bad = _first_bad(rows)
    if bad is not None:
        raise _not_finite(path, tensor, (batch_index, int(uniq[bad[0]]), *bad[1:]), raw[bad], dtype, param)
    return rows[inverse]


def read_shard(path: str | Path, tensor: str, batch_index: int, layout: Layout, comm: Any, dtype: Any,
               param: str = "input") -> np.ndarray:
    """This rank's serialized shard of ``tensor``: contiguous natural read + one all-to-all exchange.

    Collective. Each rank checks its natural block for NaN/Inf (and that it
    could be read at all) before the exchange; if any rank found a problem, every rank raises the same ConfigError
    (the lowest such rank's, which holds the first bad natural index).
    """
    rank, shard = comm.Get_rank(), layout.shard
    lo, hi = rank * shard, (rank + 1) * shard
    error, block = None, None
    try:
        raw = _read_block(path, tensor, batch_index, slice(lo, hi), param)
    except ConfigError as exc:
        error = exc
    else:
        block = _as_dtype(raw, dtype)
        bad = _first_bad(block)
        error = None if bad is None else _not_finite(path, tensor, (batch_index, lo + bad[0], *bad[1:]), raw[bad],
                                                     dtype, param)
    error = agree(comm, error)            # every rank raises the lowest rank's error: no rank waits
    if error is not None:
        raise error
    serial = layout.serialized_of(np.arange(lo, hi, dtype=np.int64))
    return redistribute(block, layout.shards.storage(serial), shard, comm)


def redistribute(rows: np.ndarray, targets: np.ndarray, shard: int, comm: Any) -> np.ndarray:
    """Rows go to the positions ``targets`` of a global index split into blocks of ``shard``; returns
    this rank's block (rows of positions ``rank*shard ..``), by one all-to-all exchange.

    Serialized -> natural for outputs, natural -> serialized for inputs: every rank
    sends and receives only its own rows, nobody holds the whole sequence.
    """
    rank, ranks = comm.Get_rank(), comm.Get_size()
    if rows.dtype.kind not in "biu" and rows.dtype not in (np.float32, np.float64):
        # ml_dtypes.bfloat16 and float16 (no MPI datatype in mpi4py): MPI moves their bits
        return redistribute(rows.view(f"u{rows.dtype.itemsize}"), targets, shard, comm).view(rows.dtype)
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
