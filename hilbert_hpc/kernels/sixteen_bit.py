"""The 16-bit provider (bfloat16, float16): the registry's 16-bit families (``tma16``, ``wgmma16``, ``mma16``),
tensor-core kernels with FP32 accumulation, FP32 softmax and the in-place log-sum-exp merge into a 16-bit
output and a float32 log-sum-exp (``docs/kernels.md``).

CuPy has no bfloat16, so the data are held by the caller (torch tensors, or CuPy uint16/float16 arrays) and
passed as raw device pointers. :func:`sixteen_bit_kernels` gives the provider of one
:class:`~hilbert_hpc.kernels.selection.KernelChoice` (the ring's ``kernels``), with the element-offset geometry
of :class:`hilbert_hpc.kernels.launch.FusedKernels`; :func:`launch_local_patterns` takes ints (or anything with
``data_ptr()`` / ``.data.ptr`` / ``__cuda_array_interface__``) plus the (n, H, D) shape and the dtype name, and
makes the choice once for the call.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Sequence

import numpy as np

from hilbert_hpc.core.arrays import is_c_contiguous, itemsize
import hilbert_hpc.kernels.tma as tma
from hilbert_hpc.kernels.launch import (FusedKernels, geometry_arguments, hop_launches, local_launches, query_chunks,
                                        segment_dilation)
from hilbert_hpc.kernels.program import Program, compiled, load
from hilbert_hpc.kernels.registry import SIXTEEN_BIT_ALIGN, SIXTEEN_BIT_TYPES, Variant, dtype_name
from hilbert_hpc.kernels.selection import KernelChoice, choose


def device_pointer(x: Any) -> int:
    """The device address of ``x``: an int, a torch tensor, a CuPy array or a CUDA-array-interface object."""
    if isinstance(x, (int, np.integer)):
        return int(x)
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    if hasattr(x, "data") and hasattr(x.data, "ptr"):
        return int(x.data.ptr)
    if hasattr(x, "__cuda_array_interface__"):
        return int(x.__cuda_array_interface__["data"][0])
    raise TypeError(f"expected a device pointer (int) or a GPU array, got {type(x).__name__}")


def launch(choice: KernelChoice, q: Any, k: Any, v: Any, out: Any, lse: Any, *, qg: tuple, kg: tuple, vg: tuple,
           lg: tuple, segments: int, heads: int, mq: int, mk: int, shift: int | None, scale: float, head_dim: int,
           og: tuple | None = None, accumulate: bool = False, final: "FinalRows | None" = None,
           final_out: Any = None) -> None:
    """One launch of ``choice``'s kernel over ``segments x heads`` problems (geometry tuples: base, segment, head
    and row strides in elements; q/k/v/out 16-bit, lse float32). ``accumulate`` (tma16 only): ``out`` is a
    float32 running output addressed by its own geometry ``og``; with ``final`` and ``final_out`` (the 16-bit
    output), the rows whose last merge this is are written rounded to ``final_out`` instead (:class:`FinalRows`)."""
    geometry = dict(qg=qg, kg=kg, vg=vg, lg=lg, segments=segments, heads=heads, mq=mq, mk=mk, shift=shift,
                    scale=scale, head_dim=head_dim, og=og, accumulate=accumulate, final=final)
    launch_parts(choice, q, k, v, out, lse, [geometry], final_out=final_out)


class LaunchRun:
    """The parts of one launch (:func:`launch_parts`), checked once, with the variant that runs them. A run of a
    call's plan (:func:`local_plan`, cached per call signature) is the same object at every call, and the
    arguments of its tma16 launch on the same arrays are cached for it (:func:`_tma_arguments`, by identity)."""

    __slots__ = ("parts", "chosen")

    def __init__(self, choice: KernelChoice, parts: Sequence[dict]) -> None:
        self.parts = tuple(checked_parts(choice, parts))
        self.chosen = (choice.accumulating() if self.parts and self.parts[0].get("accumulate")
                       else choice.variant)


def checked_parts(choice: KernelChoice, parts: Sequence[dict]) -> list[dict]:
    """``parts`` (keyword arguments of :func:`launch`) without the empty ones, each checked against what the
    16-bit kernels read (row alignment, scale, head dim of ``choice``)."""
    parts = [p for p in parts if p["segments"] and p["heads"] and p["mq"] and p["mk"]]
    for p in parts:
        qg, kg, vg = p["qg"], p["kg"], p["vg"]
        if math.gcd(*qg, *kg, *vg, SIXTEEN_BIT_ALIGN) != SIXTEEN_BIT_ALIGN:
            raise ValueError(f"the 16-bit kernel needs rows and offsets aligned to {SIXTEEN_BIT_ALIGN} elements, got "
                             f"q {qg}, k {kg}, v {vg}")
        if not p["scale"] > 0:
            raise ValueError(f"the 16-bit kernel needs scale > 0, got {p['scale']}")
        if p["head_dim"] != choice.head_dim:
            raise ValueError(f"the kernel was chosen for head_dim {choice.head_dim}, got {p['head_dim']}")
    return parts


def launch_parts(choice: KernelChoice, q: Any, k: Any, v: Any, out: Any, lse: Any,
                 parts: "Sequence[dict] | LaunchRun", final_out: Any = None) -> None:
    """Launches (keyword arguments of :func:`launch`) that differ only in their first elements and head counts
    (the head offsets of one pattern: :func:`head_offset_parts`) as one: tma16 runs them in one launch, a part
    each; the other kernels launch them one by one. ``parts`` may be a :class:`LaunchRun` of ``choice`` (checked
    already)."""
    run = parts if isinstance(parts, LaunchRun) else LaunchRun(choice, parts)
    parts, chosen = run.parts, run.chosen
    if not parts:
        return
    fn = compiled(chosen)
    if chosen.variant == "tma16":
        final = None if final_out is None or parts[0].get("final") is None else final_out
        _launch_tma(fn, run, (q, k, v, out, lse), final)
        return
    ptrs = tuple(np.uint64(device_pointer(x)) for x in (q, k, v, out, lse))
    for p in parts:
        for qc, lc, mc, sc in query_chunks(p["qg"], p["lg"], p["mq"], p["shift"], chosen.block_queries):
            grid = (p["segments"] * p["heads"], -(-mc // chosen.block_queries))
            args = (*ptrs, *geometry_arguments(qc, p["kg"], p["vg"], lc, p["heads"], mc, p["mk"], sc, p["scale"]))
            fn(grid, (chosen.threads,), args, shared_mem=chosen.shared_bytes)


#: the fields of a launch that its parts share (launch_parts): all but the first elements and the head count
SHARED_FIELDS = ("segments", "mq", "mk", "shift", "scale", "head_dim", "accumulate")
#: the geometries whose strides the parts share and whose first elements differ
GEOMETRY_FIELDS = ("qg", "kg", "vg", "lg", "og")


def _shared_key(launch: dict) -> tuple:
    """What a launch must share with the others of one tma16 launch (launch_parts)."""
    final = launch.get("final")
    geometry = tuple(None if launch.get(f) is None else tuple(launch[f][1:]) for f in GEOMETRY_FIELDS)
    rows = None if final is None else (tuple(final.geometry[1:]), final.row, final.later)
    return (*(launch.get(f) for f in SHARED_FIELDS), geometry, rows)


def head_offset_parts(launches: Sequence[dict]) -> list[list[dict]]:
    """``launches`` in order, adjacent ones that :func:`launch_parts` can run as one launch put together: those
    of one pattern's head offsets (``launch.local_launches``, ``group_launches``: the same strides, rows and
    segments; other first elements and head counts)."""
    runs: list[list[dict]] = []
    for kw in launches:
        # a part whose log-sum-exp starts where one of the run's does is the same pattern again: its rows are
        # those of that part, merged after it, not beside it
        if (runs and _shared_key(runs[-1][-1]) == _shared_key(kw)
                and all(p["lg"][0] != kw["lg"][0] for p in runs[-1])):
            runs[-1].append(kw)
        else:
            runs.append([kw])
    return runs


#: most blocks of a one-dimensional grid
MAX_GRID_X = 2**31 - 1
#: bytes at the end of a tma16 launch's arguments in device memory that hold its item counter (an int32, 16 bytes
#: keep the buffer's size a multiple of 16)
COUNTER_BYTES = 16
#: bytes of K and V that the problems of one group of a causal tma16 launch share (a third of an H100's L2)
CAUSAL_GROUP_BYTES = 16 * 2**20
#: one part of a tma16 launch in device memory, after its maps (LaunchPart in dilated_fwd_tma_16.cu)
LAUNCH_PART = np.dtype([("o_base", "<i8"), ("l_base", "<i8"), ("f_base", "<i8"), ("first_item", "<i4"),
                        ("heads", "<i4")])


def tma_launch_args(chosen: Variant, pointers: tuple, parts: Sequence[dict], *, sms: int = 0,
                    final: tuple | None = None) -> tuple[tuple, tuple, tuple, bytes]:
    """(map geometries of Q, K, V of each part; grid; the kernel arguments after the maps and work-counter
    pointers; the parts' table, LAUNCH_PART each, which follows the maps in device memory) of one tma16 launch
    of ``parts`` (keyword arguments of :func:`launch` that differ only in their first elements and head counts;
    pointers: q, k, v, out, lse as ints; a part's output geometry ``og`` defaults to its Q's). The work items
    (query blocks, those of one problem adjacent; part after part) are walked by a grid of one block each, or,
    where the configuration is persistent, of one block per SM (``sms``, the GPU's multiprocessors) that take
    the items after their first from a counter in launch order, so blocks with short (causal) items take more.
    Causal items go by groups of problems whose K and V fit in ``CAUSAL_GROUP_BYTES``, longest first inside a
    group (:func:`item_group`). ``final``: (16-bit output pointer, later-pattern table pointer) of a float32
    running output whose rows' last merges write the 16-bit output, each part's :class:`FinalRows` saying
    which."""
    keys = chosen.config[0]
    qptr, kptr, vptr, optr, lptr = (int(x) for x in pointers)
    if not parts:
        raise ValueError(f"{chosen.variant}: a launch of no parts")
    if len({_shared_key(p) for p in parts}) != 1:
        raise ValueError(f"{chosen.variant}: the parts of one launch differ in more than their first elements "
                         "and head counts")
    first = parts[0]
    segments, mq, mk, shift, scale = (first[x] for x in ("segments", "mq", "mk", "shift", "scale"))
    qblocks = -(-mq // chosen.block_queries)
    outs = [p["qg"] if p.get("og") is None else p["og"] for p in parts]   # each part's output geometry
    maps: list = []
    table = np.zeros(len(parts), dtype=LAUNCH_PART)
    items = 0
    for i, p in enumerate(parts):
        maps += [tma.map_geometry(qptr, p["qg"], mq, p["heads"], segments, chosen.head_dim, 64),
                 tma.map_geometry(kptr, p["kg"], mk, p["heads"], segments, chosen.head_dim, keys),
                 tma.map_geometry(vptr, p["vg"], mk, p["heads"], segments, chosen.head_dim, keys)]
        table[i] = (outs[i][0], p["lg"][0], 0 if final is None else p["final"].geometry[0], items, p["heads"])
        items += segments * p["heads"] * qblocks
    persistent = chosen.config[6] == 1
    if persistent and sms < 1:
        raise ValueError(f"{chosen.variant}: a persistent launch needs the GPU's multiprocessor count, got {sms}")
    blocks = min(items, sms) if persistent else items
    if items + blocks > MAX_GRID_X:              # the kernel's int item index reaches items + the grid
        raise ValueError(f"{chosen.variant}: {items} query blocks exceed a one-dimensional grid")
    problems = max(segments * p["heads"] for p in parts)
    group = item_group(problems, mk, chosen.head_dim) if shift is not None else 1
    args = (np.uint64(optr), np.uint64(lptr), *(np.int64(x) for x in (*outs[0][1:], *first["lg"][1:])),
            np.int32(len(parts)), np.int32(qblocks), np.int32(items), np.int32(mq), np.int32(mk),
            np.int32(shift is not None), np.int32(shift or 0), np.float32(scale), np.int32(group))
    if final is None:
        args += (np.uint64(0), np.uint64(0), np.int32(0), *(np.int64(0) for _ in range(4)))
    else:
        out16, later = final
        rows = first["final"]
        args += (np.uint64(int(out16)), np.uint64(int(later)), np.int32(len(rows.later)),
                 *(np.int64(x) for x in (*rows.geometry[1:], rows.row)))
    return tuple(maps), (blocks,), args, table.tobytes()


def item_group(problems: int, keys: int, head_dim: int) -> int:
    """Problems per group of a causal tma16 launch: as many as keep their K and V (``keys`` rows each, in
    16 bits) within ``CAUSAL_GROUP_BYTES`` of L2, at least one. The kernel runs a group's query blocks
    longest first across the group's problems, so a launch ends on short items, not on one problem's long
    ones, while the blocks resident at one time still share a few problems' K and V."""
    per_problem = 2 * keys * head_dim * 2
    return max(1, min(problems, CAUSAL_GROUP_BYTES // per_problem))


@lru_cache(maxsize=None)
def multiprocessors(device_id: int) -> int:
    """The multiprocessor (SM) count of a GPU."""
    import cupy

    return int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"])


def _launch_tma(fn: Any, run: LaunchRun, arrays: tuple, final_out: Any = None) -> None:
    """One tma16 launch of ``run`` (tma_launch_args) on ``arrays`` (q, k, v, out, lse); ``final_out``: the
    16-bit output of the rows whose last merge this is (the parts' FinalRows say which)."""
    import cupy

    pointers = tuple(device_pointer(x) for x in arrays)
    device = cupy.cuda.Device().id
    final = None if final_out is None else device_pointer(final_out)
    buffer, grid, args = _tma_arguments(run, pointers, final, device)
    work = buffer.data.ptr + buffer.nbytes - COUNTER_BYTES     # the persistent blocks' item counter, set to 0
    cupy.cuda.runtime.memsetAsync(work, 0, COUNTER_BYTES, cupy.cuda.get_current_stream().ptr)
    fn(grid, (run.chosen.threads,), (np.uint64(buffer.data.ptr), np.uint64(work), *args),
       shared_mem=run.chosen.shared_bytes)


@lru_cache(maxsize=512)
def _tma_arguments(run: LaunchRun, pointers: tuple, final_out: int | None, device: int) -> tuple[Any, tuple, tuple]:
    """(the maps, the parts' table and the launch's item counter (its last ``COUNTER_BYTES``, set to zero on the
    stream before each launch) in device memory, grid, the arguments after the two pointers) of ``run``'s tma16
    launch on the arrays at ``pointers`` (q, k, v, out, lse) of ``device``, computed once for each (run, arrays):
    the plan of a call repeated on the same arrays costs a lookup and a memset (the run is keyed by identity, and
    kept alive by the key)."""
    final = None
    if final_out is not None:
        table = _later_table(device, run.parts[0]["final"].later)
        final = (final_out, 0 if table is None else table.data.ptr)
    maps, grid, args, table_bytes = tma_launch_args(run.chosen, pointers, run.parts, sms=multiprocessors(device),
                                                    final=final)
    return tma.device_maps(device, maps, table_bytes + bytes(COUNTER_BYTES)), grid, args


@lru_cache(maxsize=64)
def _later_table(device: int, later: tuple) -> Any:
    """``later`` ((dilation, end row) pairs) as int64 in device memory of ``device`` (None when empty), kept by
    this cache."""
    import cupy

    if not later:
        return None
    with cupy.cuda.Device(device):
        return cupy.asarray(np.array(later, dtype=np.int64).reshape(-1))


def check_arrays(q: Any, k: Any, v: Any, out: Any, lse: Any) -> None:
    """Refuse what the 16-bit kernels would misread: arrays that are not C-contiguous, q/k/v/out items that
    are not 2 bytes, an lse that is not float32, base addresses not aligned to 16 bytes (cp.async).
    Raw pointers (ints) are only checked for alignment."""
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)):
        if isinstance(x, (int, np.integer)):
            if int(x) % 16:
                raise ValueError(f"the 16-bit kernel needs {name} aligned to 16 bytes, got address {int(x):#x}")
            continue
        contiguous = is_c_contiguous(x)
        wanted = 4 if name == "lse" else 2
        if not contiguous or itemsize(x) != wanted:
            raise ValueError(f"the 16-bit kernel needs C-contiguous {name} of {wanted}-byte items"
                             f"{' (float32)' if name == 'lse' else ''}, got {getattr(x, 'dtype', type(x))}"
                             f"{'' if contiguous else ', not contiguous'}")
        if name == "lse" and "float32" not in str(x.dtype):
            raise ValueError(f"the 16-bit kernel needs a float32 lse, got {x.dtype}")
        if device_pointer(x) % 16:
            raise ValueError(f"the 16-bit kernel needs {name} aligned to 16 bytes")


@dataclass(frozen=True)
class FinalRows:
    """Which rows of a launch into a float32 running output have their last merge there, and where their 16-bit
    result goes: a launch's row j of problem (s, h) is element ``geometry`` (base, segment, head, row strides)
    of the (n, H, D) 16-bit output, i.e. sequence row i = offset // ``row``, head offset % ``row`` // D. A later
    pattern (dilation r, whole segments ending at row ``end``; ``later``: one pair each) merges it again when
    i < end and i = head (mod r): a head reads the rows head mod r of each segment (r divides the segment)."""

    geometry: tuple
    row: int
    later: tuple


def rounds_at_last_merge(patterns: Sequence) -> bool:
    """Whether every pattern's dilation divides its segment, so that a later pattern selects exactly the rows
    :class:`FinalRows` says (parse_patterns ensures it; otherwise a separate pass rounds the running output)."""
    return all(w % r == 0 for w, r in map(segment_dilation, patterns))


def group_launches(patterns: Sequence, causal: bool, scale: float, n: int, heads: int, head_dim: int, h0: int,
                   h1: int, group: int, final: bool = False) -> list[dict]:
    """The launches (keyword arguments of :func:`launch`) of local ``patterns`` for heads ``h0 .. h1 - 1`` of
    (n, heads, head_dim) arrays into a float32 scratch (n, group, head_dim) that holds those heads
    (``launch.local_launches`` restricted to the group, with the scratch's output geometry ``og``); ``final``:
    each with its :class:`FinalRows` (the patterns after its own), so rows go to the 16-bit output at their
    last merge."""
    launches = []
    for index, p in enumerate(patterns):
        later = tuple((r, n // w * w) for w, r in map(segment_dilation, patterns[index + 1:]))
        for kw in local_launches([p], causal, scale, n, heads, head_dim, h0, h1, out_heads=group):
            kw["accumulate"] = True
            if final:
                kw["final"] = FinalRows(tuple(kw["qg"]), heads * head_dim, later)
            launches.append(kw)
    return launches


#: the dtype the ring's 16-bit running output is held in (the bits of bfloat16 / float16)
OUT_DTYPE = np.int16


def sixteen_bit_kernels(choice: KernelChoice) -> "SixteenBitKernels":
    """The fused-kernel provider of a 16-bit ``choice``: local patterns and packed ring blocks on 16-bit arrays
    (held as int16 bits) with a 16-bit output."""
    if not choice.sixteen_bit:
        raise ValueError(f"the 16-bit provider runs bfloat16 and float16 choices, not {choice.dtype}")
    return SixteenBitKernels(choice)


class SixteenBitKernels:
    """Local patterns and ring blocks of one 16-bit kernel choice, the provider the ring takes as ``kernels``.

    Ring blocks, and local patterns where no float32 running output is kept (``choice.scratch_heads`` is 0:
    every kernel but tma16) or the scratch does not fit, merge into the 16-bit running output launch by launch
    (rounded once per launch). With tma16, local patterns merge into a float32 running output kept for a
    group of heads at a time (``choice.scratch_heads``): the group's 16-bit output is widened into it, every
    local pattern is merged in FP32, and each row is rounded to 16 bits once, at its last merge
    (:class:`FinalRows`; or by a pass after the last launch where a dilation does not divide its segment), as
    docs/semantics.md asks (FP32 running output)."""

    def __init__(self, choice: KernelChoice) -> None:
        self.choice = choice
        self.rounding = FusedKernels(partial(launch, choice), check_arrays, out_dtype=OUT_DTYPE)

    def accumulators(self, xp: Any, n: int, heads: int, dv: int, dtype: Any) -> tuple[Any, Any]:
        """Running output zeros (n, H, Dv), 16-bit (int16 bits), and log-sum-exp -inf (n, H) float32."""
        return self.rounding.accumulators(xp, n, heads, dv, dtype)

    def ring_block(self, qs: Any, block: Any, geom: Any, pos: int, src: int, pair: Any, scale: float, out: Any,
                   lse: Any) -> None:
        """A packed ring block merged into the 16-bit running output (the geometry of
        ``FusedKernels.ring_block``), its head offsets in one launch where the kernel allows
        (:func:`head_offset_parts`); the runs are worked out once per hop of a case (:func:`hop_runs`)."""
        n, heads, d = (int(x) for x in qs.shape)
        for run in hop_runs(self.choice, geom, pos, src, pair, float(scale), heads, d):
            launch_parts(self.choice, qs, block, block, out, lse, run)

    def gathered(self, qs: Any, sequence: Any, gather: Any, scale: float, out: Any, lse: Any) -> None:
        """A gathered pattern's rows in sequence order merged into the 16-bit running output (the geometry of
        ``FusedKernels.gathered``), its head offsets in one launch where the kernel allows (runs worked out once
        per case: :func:`gathered_runs`)."""
        n, heads, d = (int(x) for x in qs.shape)
        check_arrays(qs, sequence, sequence, out, lse)
        for run in gathered_runs(self.choice, gather, float(scale), heads, d):
            launch_parts(self.choice, qs, sequence, sequence, out, lse, run)


    def local_patterns(self, qs: Any, ks: Any, vs: Any, patterns: Sequence, causal: bool, scale: float, out: Any,
                       lse: Any, shape: Sequence[int] | None = None) -> None:
        """Patterns whose segments lie inside these (n, H, D) arrays, merged into ``out`` (16-bit) and ``lse``."""
        n, heads, d = (int(x) for x in (qs.shape if shape is None else shape))
        group = self.choice.scratch_heads(heads)
        if not group or not patterns:
            return self.rounding.local_patterns(qs, ks, vs, patterns, causal, scale, out, lse, shape=shape)
        check_arrays(qs, ks, vs, out, lse)
        scratch = _float32_scratch((n, group, d))
        if scratch is None:                           # at the memory limit: round once per launch instead
            return self.rounding.local_patterns(qs, ks, vs, patterns, causal, scale, out, lse, shape=shape)
        out_ptr, scratch_ptr, lse_ptr = device_pointer(out), device_pointer(scratch), device_pointer(lse)
        final = rounds_at_last_merge(patterns)
        plan = local_plan(self.choice, tuple(map(segment_dilation, patterns)), bool(causal), float(scale), n, heads, d,
                          group, final)
        for h0, h1, runs in plan:
            first = out_ptr + 2 * h0 * d                 # the group's first element of row 0 (16-bit)
            rows = dict(rows=n, width=(h1 - h0) * d, head_dim=d, l_stride=heads, l_first=h0)
            _convert("widen_16", self.choice.dtype, first, scratch_ptr, lse_ptr, src_stride=heads * d, dst_stride=group * d,
                     **rows)
            for run in runs:
                launch_parts(self.choice, qs, ks, vs, scratch, lse, run, final_out=out)
            if not final:                             # rows not rounded at their last merge: round them now
                _convert("narrow_16", self.choice.dtype, scratch_ptr, first, lse_ptr, src_stride=group * d,
                         dst_stride=heads * d, **rows)
        del scratch


@lru_cache(maxsize=1024)
def hop_runs(choice: KernelChoice, geom: Any, pos: int, src: int, pair: Any, scale: float, heads: int,
             head_dim: int) -> tuple[LaunchRun, ...]:
    """The checked runs of one ring hop's piece pair (``launch.ring_launches``) merging into a 16-bit output,
    head offsets together (:func:`head_offset_parts`), made once per case and hop (``geom``, the case's
    ``RingPattern``, is keyed by identity): every call's hops then cost their launches alone, and a run's tma16
    arguments are cached with it (:func:`_tma_arguments`)."""
    launches = hop_launches(geom, pos, src, pair, scale, heads, head_dim)
    return tuple(LaunchRun(choice, parts) for parts in head_offset_parts(launches))


@lru_cache(maxsize=256)
def gathered_runs(choice: KernelChoice, gather: Any, scale: float, heads: int, head_dim: int) -> tuple[LaunchRun, ...]:
    """The checked runs of a gathered pattern (``GatherPattern.launches``, keyed by identity: the case's), made
    once per case, as :func:`hop_runs`."""
    return tuple(LaunchRun(choice, parts) for parts in head_offset_parts(gather.launches(scale, heads, head_dim)))


@lru_cache(maxsize=64)
def local_plan(choice: KernelChoice, patterns: tuple, causal: bool, scale: float, n: int, heads: int, head_dim: int,
               group: int, final: bool) -> tuple[tuple[int, int, tuple[LaunchRun, ...]], ...]:
    """The launches of local ``patterns`` into a float32 running output of ``group`` heads (SixteenBitKernels):
    (first head, end head, its launch runs) per group of heads, worked out once per call signature (the
    Python of a call's planning took as long as the GPU's first launch of a small problem)."""
    plan = []
    for h0 in range(0, heads, group):
        h1 = min(heads, h0 + group)
        launches = group_launches(patterns, causal, scale, n, heads, head_dim, h0, h1, group, final)
        plan.append((h0, h1, tuple(LaunchRun(choice, parts) for parts in head_offset_parts(launches))))
    return tuple(plan)


def _float32_scratch(shape: tuple) -> Any:
    """An uninitialized float32 array on the current GPU, or None where it does not fit. From torch's caching
    allocator when torch is loaded and its current stream is CuPy's (the 16-bit tensors live there, so the
    memory goes back to them), else from CuPy's pool."""
    import cupy

    torch = sys.modules.get("torch")
    # torch's blocks are reused in the order of torch's current stream: only where the kernels run on it too
    if torch is not None and torch.cuda.current_stream().cuda_stream == cupy.cuda.get_current_stream().ptr:
        try:
            return torch.empty(shape, dtype=torch.float32, device=f"cuda:{cupy.cuda.Device().id}")
        except torch.cuda.OutOfMemoryError:
            return None
    try:
        return cupy.empty(shape, dtype=cupy.float32)
    except cupy.cuda.memory.OutOfMemoryError:
        return None


#: widen_16<T> / narrow_16<T>: the 16-bit output of a group of heads to and from its float32 running output
CONVERT_SOURCE = "convert_16.cu"
CONVERT_THREADS = 256


def convert_names() -> list[str]:
    """Template instantiations of the conversion kernels (both directions, both 16-bit types)."""
    return [f"{kind}<{t}>" for kind in ("widen_16", "narrow_16") for t in SIXTEEN_BIT_TYPES.values()]


#: the conversion kernels' program (both directions, both 16-bit types), compiled for the device's sm_XY
CONVERT_PROGRAM = Program(CONVERT_SOURCE, tuple(convert_names()))


def _convert(kind: str, dtype: str, src: int, dst: int, lse: int, *, rows: int, width: int, head_dim: int,
             src_stride: int, dst_stride: int, l_stride: int, l_first: int) -> None:
    """``kind`` (widen_16: 16-bit -> float32; narrow_16: back, to nearest even) of ``rows`` rows of ``width``
    elements between device addresses ``src`` and ``dst`` (row strides in elements), for the (row, head)
    pairs whose log-sum-exp (float32 at ``lse``, row stride ``l_stride``, the group's first head ``l_first``)
    is not -inf."""
    fn = load(CONVERT_PROGRAM).function(f"{kind}<{SIXTEEN_BIT_TYPES[dtype]}>")
    pairs = rows * (width // head_dim)                 # a thread a (row, head) pair
    blocks = max(1, min(-(-pairs // CONVERT_THREADS), 1 << 16))
    fn((blocks,), (CONVERT_THREADS,), (np.uint64(src), np.uint64(dst), np.uint64(lse), np.int64(rows),
                                       np.int32(width), np.int32(head_dim), np.int64(src_stride),
                                       np.int64(dst_stride), np.int64(l_stride), np.int64(l_first)))


def launch_local_patterns(q: Any, k: Any, v: Any, patterns: Sequence, causal: bool, scale: float, out: Any,
                          lse: Any, shape: Sequence[int] | None = None, dtype: Any = None) -> None:
    """Patterns whose segments lie inside these (n, H, D) 16-bit arrays, merged into ``out`` (16-bit, same
    layout) and ``lse`` ((n, H) float32, natural log; -inf where nothing was merged yet), in place.

    q, k, v, out, lse: device pointers (ints) to C-contiguous data, or tensors/arrays (their pointers are
    taken); ``shape`` (n, H, D) and ``dtype`` ('bfloat16' / 'float16', or a torch dtype) are read from
    ``q`` when it is a tensor and not given. The geometry is ``hilbert_hpc.kernels.launch.FusedKernels``'; the
    kernel is chosen once for the call (:func:`hilbert_hpc.kernels.selection.choose`).
    """
    if shape is None:
        if not hasattr(q, "shape"):
            raise ValueError("give shape=(n, H, D) with raw pointers")
        shape = tuple(q.shape)
    if dtype is None:
        if not hasattr(q, "dtype"):
            raise ValueError("give dtype='bfloat16' or 'float16' with raw pointers")
        dtype = q.dtype
    choice = choose(dtype_name(dtype), int(shape[2]))
    sixteen_bit_kernels(choice).local_patterns(q, k, v, patterns, causal, scale, out, lse, shape=shape)
