"""Max-length search on one device: the longest sequence a backend computes, and its peak memory.

For LongNet-style patterns (fixed local patterns plus a global one, segment N
and dilation N/``global_rows``) the search doubles N from ``start`` until a
run does not fit, then bisects in multiples of ``granule`` (the largest local
segment) to a relative precision of 1/64. Each trial makes Q, K, V directly on
the device (counter-based, as in every job), releases cached memory, runs the
attention once and records its time and the allocator's high-water mark
against the floor, the bytes of Q, K, V and O. The longest run is checked on
sampled rows against a float64 evaluation of the definition.

With ``pass = "forward+backward"`` each trial also runs the backward (from a
loss gradient dO made from the seed, as ``run`` makes it) and times it: what
fits is then a whole training step, the floor counts dO, dQ, dK and dV too, and
every trial records ``planned_bytes``, what ``plan`` counts for the case (the
same memory model, its backward included, without a gradient check). Only the
output of the longest run is checked; its gradients are not (``run`` checks them).

Study file (``jobs/max_length.toml``)::

    [search]
    name = "max_length"
    output = "results/max_length.h5"
    backends = ["cuda-fp32", "torch"]
    heads = 8
    head_dim = 64
    local_patterns = [[2048, 1], [8192, 4], [32768, 16]]
    global_rows = 2048          # global pattern (N, N / global_rows); 0 for none
    start = 1048576
    limit = 67108864            # never try more tokens than this
    seed = 11
    accuracy_rows = 4
    pass = "forward"            # or "forward+backward" (backends that compute it)
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np

from hilbert_hpc.core import device_memory
from hilbert_hpc.errors import ConfigError, JobFileError, UserError
from hilbert_hpc.core.patterns import Pattern, parse_patterns


@dataclass(frozen=True)
class Search:
    """A validated max-length study."""

    name: str
    output: str
    backends: tuple[str, ...]
    heads: int
    head_dim: int
    local_patterns: tuple[Pattern, ...]
    global_rows: int
    start: int
    limit: int
    seed: int
    accuracy_rows: int
    text: str = ""
    dtype: str = "float32"
    pass_: str = "forward"

    @property
    def granule(self) -> int:
        """Every tried length is a multiple of this (the largest local segment and global_rows)."""
        g = max(p.segment for p in self.local_patterns)
        return math.lcm(g, self.global_rows) if self.global_rows else g

    def patterns(self, tokens: int) -> tuple[Pattern, ...]:
        """The patterns at sequence length ``tokens``."""
        extra = (Pattern(tokens, tokens // self.global_rows),) if self.global_rows else ()
        return tuple(self.local_patterns) + extra


SEARCH_KEYS = {"name", "output", "backends", "heads", "head_dim", "local_patterns", "global_rows", "start", "limit",
               "seed", "accuracy_rows", "dtype", "pass"}


def load_search(path: str | Path) -> Search:
    """Read and validate a max-length study file; a JobFileError names the problem."""
    from hilbert_hpc.backends import BACKENDS, PASSES, check_backend, check_pass
    from hilbert_hpc.study.jobfile import check_job_seed, check_name, read_toml

    doc, text = read_toml(path)
    if set(doc) != {"search"} or not isinstance(doc["search"], dict):
        raise JobFileError("a max-length study has exactly one [search] table", str(path))
    s = doc["search"]
    for key in s:
        if key not in SEARCH_KEYS:
            raise JobFileError(f"unknown key {key!r} (allowed: {', '.join(sorted(SEARCH_KEYS))})", f"search.{key}")

    def integer(key: str, default: int, lo: int) -> int:
        value = s.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise JobFileError(f"expected an integer >= {lo}, got {value!r}", f"search.{key}")
        return value

    output = s.get("output", "results/max_length.h5")
    if not isinstance(output, str) or not output.strip():
        raise JobFileError(f"expected a file name (a TOML string such as \"results/max_length.h5\"), got {output!r}",
                           "search.output")
    backends = s.get("backends", ["cuda-fp32"])
    if not isinstance(backends, list) or not backends or any(b not in BACKENDS for b in backends):
        raise JobFileError(f"expected a list of backends from {', '.join(BACKENDS)}, got {backends!r}",
                           "search.backends")
    try:
        local = parse_patterns(s.get("local_patterns", [[2048, 1]]), "search.local_patterns")
    except ConfigError as exc:
        raise JobFileError(exc.message, exc.param) from None
    search = Search(name=check_name(s.get("name", "max_length"), "search.name"),
                    output=output, backends=tuple(backends),
                    heads=integer("heads", 8, 1), head_dim=integer("head_dim", 64, 1),
                    local_patterns=local, global_rows=integer("global_rows", 2048, 0),
                    start=integer("start", 1 << 20, 1), limit=integer("limit", 1 << 26, 1),
                    seed=check_job_seed(s.get("seed", 11), "search.seed"),
                    accuracy_rows=integer("accuracy_rows", 4, 0), text=text,
                    dtype=s.get("dtype", "float32"), pass_=s.get("pass", "forward"))
    if search.pass_ not in PASSES:
        raise JobFileError(f"expected one of {', '.join(map(repr, PASSES))}, got {search.pass_!r}", "search.pass")
    try:
        for b in backends:
            check_backend(search.dtype, b, "search.dtype")
            check_pass(search.pass_, b, "search.pass")
    except ConfigError as exc:
        raise JobFileError(exc.message, exc.param) from None
    if search.start % search.granule:
        raise JobFileError(f"start = {search.start} is not a multiple of {search.granule} (the largest segment "
                           f"and global_rows)", "search.start")
    if search.limit < search.start:
        raise JobFileError(f"limit = {search.limit} is below start = {search.start}", "search.limit")
    return search


def _is_out_of_memory(exc: BaseException) -> bool:
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(exc, cupy.cuda.memory.OutOfMemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()


def trial(search: Search, backend: str, tokens: int, check_rows: int = 0) -> dict[str, Any]:
    """One attempt at ``tokens``: fits or not, forward (and backward) time, peak bytes, floor bytes, what ``plan``
    counts, and (optionally) the output's accuracy."""
    from hilbert_hpc.study.jobfile import Case
    from hilbert_hpc.core.arrays import RowReader
    from hilbert_hpc.distributed.mpi import SingleProcessComm
    from hilbert_hpc.study.gradients import backward_pass
    from hilbert_hpc.study.measure import backend_inputs, dout_shard, local_accuracy
    from hilbert_hpc.study.plan import estimate
    from hilbert_hpc.study.setup import check_case

    case = Case(case_id=f"{backend}-{tokens}", name=search.name, grid=(tokens,), patterns=search.patterns(tokens),
                heads=search.heads, head_dim=search.head_dim, backend=backend, dtype=search.dtype,
                pass_=search.pass_)
    setup = check_case(case, 1)
    be, layout = setup.backend, setup.layout
    both = backward_pass(case)
    floor = (8 if both else 4) * tokens * search.heads * search.head_dim * setup.precision.itemsize
    result = {"backend": backend, "pass": search.pass_, "tokens": tokens, "fits": False, "attention_s": np.nan, "backward_s": np.nan,
              "peak_bytes": 0, "floor_bytes": floor, "planned_bytes": estimate(case, setup=setup, accuracy_rows=0).memory_bytes,
              "memory_ratio": np.nan, "max_rel_err": np.nan}
    device_memory.reset_peak()
    args = (case.patterns, False, case.softmax_scale, setup.kernel)
    try:
        comm = SingleProcessComm()
        qkv = [be.to_device(x, search.dtype) for x in backend_inputs(setup, search.seed, comm, 0)]
        dout = dout_shard(setup, search.seed, comm, 0) if both else None
        be.synchronize()
        device_memory.reset_peak()          # keeps Q, K, V (and dO); drops generation temporaries
        t0 = time.perf_counter()
        out, lse = be.serialized_forward(*qkv, *args) if both else (be.serialized_attention(*qkv, *args), None)
        be.synchronize()
        result["attention_s"] = time.perf_counter() - t0
        if both:
            t0 = time.perf_counter()
            grads = be.serialized_backward(*qkv, out, lse, dout, *args[:3], setup.backward_kernel)
            be.synchronize()
            result["backward_s"] = time.perf_counter() - t0
            del grads
        result["peak_bytes"] = device_memory.peak_bytes()
        result["memory_ratio"] = result["peak_bytes"] / floor if result["peak_bytes"] else np.nan
        result["fits"] = True
        if check_rows:
            rows = RowReader(out)
            acc = local_accuracy(case, search.seed, check_rows, rows, layout, 0)
            result["max_rel_err"] = acc["max_abs"] / max(acc["max_ref"], np.finfo(np.float64).tiny)
    except Exception as exc:  # noqa: BLE001 - only running out of memory is an answer; anything else is raised
        if not _is_out_of_memory(exc):
            raise
    finally:
        qkv = out = lse = dout = None  # noqa: F841 - release before the next trial
        device_memory.reset_peak()
    return result


def search_backend(search: Search, backend: str, log: Callable[[dict], None]) -> list[dict]:
    """Doubling then bisection for one backend; every trial is logged; the last row is the longest fit."""
    trials, lo, hi = [], 0, None
    n = search.start
    while n <= search.limit:
        r = trial(search, backend, n)
        trials.append(r)
        log(r)
        if not r["fits"]:
            hi = n
            break
        lo, n = n, 2 * n
    limited = hi is None
    if limited:
        hi = lo
    while lo and hi - lo > max(search.granule, lo // 64):
        mid = (lo + hi) // 2 // search.granule * search.granule
        if mid in (lo, hi):
            break
        r = trial(search, backend, mid)
        trials.append(r)
        log(r)
        lo, hi = (mid, hi) if r["fits"] else (lo, mid)
    if lo:
        best = trial(search, backend, lo, check_rows=search.accuracy_rows)
        best["longest"] = True
        best["limited"] = limited
        trials.append(best)
        log(best)
    return trials


COLUMNS = ("backend", "tokens", "fits", "attention_s", "backward_s", "peak_bytes", "floor_bytes", "planned_bytes",
           "memory_ratio", "max_rel_err")


def _print_row(r: dict, stream: TextIO) -> None:
    mark = ("  <- longest (the study's limit)" if r.get("limited") else "  <- longest") if r.get("longest") else ""
    both = r["pass"] == "forward+backward"
    arrays = "Q/K/V/O/dO/dQ/dK/dV" if both else "Q/K/V/O"
    if r["fits"]:
        print(f"{r['backend']:<10} {r['tokens']:>12,}  fits     {r['attention_s']:9.3f} s  "
              + (f"+ backward {r['backward_s']:9.3f} s  " if both else "")
              + (f"peak {r['peak_bytes'] / 2**30:7.2f} GiB  = {r['memory_ratio']:.3f} x {arrays}"
                 if r["peak_bytes"] else "peak not measured (host memory)")
              + (f" (plan {r['planned_bytes'] / 2**30:.2f} GiB)" if both else "")
              + (f"  max rel err {r['max_rel_err']:.1e}" if np.isfinite(r["max_rel_err"]) else "") + mark,
              file=stream, flush=True)
    else:
        print(f"{r['backend']:<10} {r['tokens']:>12,}  does not fit ({arrays} alone: "
              f"{r['floor_bytes'] / 2**30:.2f} GiB)", file=stream, flush=True)


def run_search(path: str | Path, output: str | None = None, stream: TextIO | None = None,
               overwrite: bool = False) -> Path:
    """Run a max-length study (one process, one device) and write its HDF5 file.

    Before the first trial: the backends are checked (a GPU backend needs a
    usable GPU) and the output is claimed (an existing file only with
    ``overwrite``); the file is written under a temporary name at the end.
    """
    stream = stream or sys.stdout
    from hilbert_hpc.backends import require_usable
    from hilbert_hpc.study.output_files import NewOutput, hdf5_attr_is

    search = load_search(path)
    for b in search.backends:
        require_usable(b, "search.backends")
    out_path = Path(output or search.output)
    with NewOutput(out_path, "hilbert-hpc max-length file", hdf5_attr_is("study", "max-length"),
                   protected=[(path, "study file")], overwrite=overwrite) as claim:
        passes = "" if search.pass_ == "forward" else f", {search.pass_}"
        print(f"hilbert-hpc: max-length search {search.name!r}, backends {', '.join(search.backends)}, "
              f"{search.dtype}{passes}, H={search.heads}, D={search.head_dim}, results -> {out_path}", file=stream,
              flush=True)
        rows = []
        for b in search.backends:
            rows += search_backend(search, b, lambda r: _print_row(r, stream))
        claim.write(lambda h5: _write_trials(h5, search, path, rows))
    if not any(r.get("longest") for r in rows):
        raise UserError(f"not even start = {search.start} tokens fit on this device", "search.start")
    return out_path


def _write_trials(h5: Any, search: Search, path: str | Path, rows: list[dict]) -> None:
    """Provenance, the study and every trial into the open HDF5 file ``h5``."""
    import h5py

    from hilbert_hpc.distributed.mpi import SingleProcessComm
    from hilbert_hpc.study.provenance import provenance
    from hilbert_hpc.study.results import hdf5_attr

    for key, value in provenance(SingleProcessComm()).items():
        h5.attrs[key] = hdf5_attr(value)
    h5.attrs["job_text"] = search.text
    h5.attrs["job_path"] = str(path)
    h5.attrs["study"] = "max-length"
    h5.attrs["dtype"] = search.dtype
    h5.attrs["pass"] = search.pass_
    g = h5.create_group("trials")
    for col in COLUMNS:
        values = [r[col] for r in rows]
        g.create_dataset(col, data=np.asarray(values, dtype=h5py.string_dtype() if col == "backend" else None))
    g.create_dataset("longest", data=np.asarray([bool(r.get("longest")) for r in rows]))
    g.attrs["units"] = json.dumps({"attention_s": "s", "backward_s": "s", "peak_bytes": "B", "floor_bytes": "B",
                                   "planned_bytes": "B"})
    g.attrs["patterns"] = json.dumps({"local": [[p.segment, p.dilation] for p in search.local_patterns],
                                      "global_rows": search.global_rows})
