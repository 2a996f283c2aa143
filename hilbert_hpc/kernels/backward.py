"""The backward provider: the registry's backward families launched with the forward's geometry.

:class:`BackwardKernels` runs one backward :class:`~hilbert_hpc.kernels.selection.KernelChoice`
(:func:`~hilbert_hpc.kernels.selection.choose_backward`) on the launches of
:func:`hilbert_hpc.kernels.launch.local_launches` (the same element-offset geometry as the forward): each adds
its pattern's terms of dQ, dK and dV (float32 accumulators shaped like Q, K and V) from Q, K, V, dO, the merged
log-sum-exp L and delta = rowsum(dO * O) (``DILATED_BWD_PARAMS`` in ``common.cuh``, docs/semantics.md section
10). Arrays are CuPy arrays, torch tensors or device pointers (ints); 16-bit data are passed as pointers.
Grid: x = the launch's problems, y = the key blocks of one problem; a problem with more key blocks than a grid
allows along y is split into key chunks (:func:`key_chunks`).

:class:`RingBackwardKernels` is the ring backward's block provider
(``distributed.ring_backward``) on them: the local patterns of a shard, and the terms of a packed ring
block launched in place with the ring forward's geometry (:func:`hilbert_hpc.kernels.launch.ring_launches`),
dK/dV into the accumulator block that travels with it. Everything is queued on the current stream.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from hilbert_hpc.core.arrays import is_c_contiguous, itemsize, is_tensor, on_gpu
from hilbert_hpc.core.blockwise import array_module
from hilbert_hpc.core.patterns import tiles_rows
from hilbert_hpc.kernels.launch import MAX_GRID_Y, geometry_arguments, hop_launches, local_launches, segment_dilation
from hilbert_hpc.kernels.program import Program, compiled, load
from hilbert_hpc.kernels.registry import BACKWARD, FLOAT32, SIXTEEN_BIT_TYPES, dtype_name
from hilbert_hpc.kernels.selection import KernelChoice
from hilbert_hpc.kernels.sixteen_bit import device_pointer, multiprocessors

#: the arrays of a backward launch, in the kernels' order (``DILATED_BWD_PARAMS``)
ARRAYS = ("q", "k", "v", "dout", "lse", "delta", "dq", "dk", "dv")
#: the inputs held in the choice's dtype (16 bits for a 16-bit choice); the others are float32
INPUTS = ("q", "k", "v", "dout")
#: elements of the float32 temporaries of one chunk of rows of :func:`row_dot`
ROW_DOT_CHUNK = 1 << 22
#: set to 0 to give every work item its own block (no persistent grids; read when BackwardKernels is made)
PERSISTENT_ENV = "HILBERT_HPC_BWD_PERSISTENT"


def key_chunks(kg: tuple, vg: tuple, mk: int, shift: int | None, block_keys: int,
               max_blocks: int = MAX_GRID_Y) -> list[tuple[tuple, tuple, int, int | None]]:
    """``(kg, vg, mk, shift)`` of launches that together cover ``mk`` key rows with at most ``max_blocks`` key
    blocks each: a chunk starting at key ``c`` moves the K/dK and V/dV bases by ``c`` rows and the causal
    shift by ``-c`` (key ``j`` of the chunk is key ``c + j`` of the problem, seen by query ``i`` when
    ``c + j <= i + shift``)."""
    rows = max_blocks * block_keys
    return [((kg[0] + c * kg[3], *kg[1:]), (vg[0] + c * vg[3], *vg[1:]), min(rows, mk - c),
             None if shift is None else shift - c) for c in range(0, mk, rows)]


def check_arrays(choice: KernelChoice, shape: Sequence[int] | None = None, **arrays: Any) -> None:
    """One clear ValueError for what the backward kernels would misread: q, k, v, dout that are not
    C-contiguous arrays of the choice's dtype (2-byte items for 16 bits); lse, delta, dq, dk, dv that are not
    C-contiguous float32; gradients not shaped like their inputs, lse / delta not (n, H) for (n, H, D) inputs.
    Raw pointers (ints) are not checked."""
    for name, x in arrays.items():
        if x is None or isinstance(x, (int, np.integer)):
            continue
        sixteen = choice.sixteen_bit and name in INPUTS
        contiguous = is_c_contiguous(x)
        ok = itemsize(x) == 2 if sixteen else "float32" in str(x.dtype)
        if not (contiguous and ok):
            wanted = f"{choice.dtype} (2-byte items)" if sixteen else "float32"
            raise ValueError(f"the backward kernel needs {name} C-contiguous {wanted}, got {x.dtype}"
                             f"{'' if contiguous else ', not contiguous'}")
    shapes = {n: tuple(x.shape) for n, x in arrays.items() if hasattr(x, "shape")}
    if shape is not None:
        shapes.setdefault("q", tuple(int(s) for s in shape))
    for grad, of in (("dq", "q"), ("dk", "k"), ("dv", "v"), ("dout", "q")):
        if grad in shapes and of in shapes and shapes[grad] != shapes[of]:
            raise ValueError(f"{grad} must have the shape of {of} {shapes[of]}, got {shapes[grad]}")
    for name in ("lse", "delta"):
        if name in shapes and "q" in shapes and shapes[name] != shapes["q"][:2]:
            raise ValueError(f"{name} must have shape {shapes['q'][:2]} (n, H), got {shapes[name]}")


class BackwardKernels:
    """Launches of one backward kernel choice. ``max_key_blocks``: most key blocks of one launch along grid y
    (more are split into key chunks; tests force small chunks). ``max_blocks``: most blocks of a persistent grid
    (default: one per SM; tests force a few, so that each block works through many items)."""

    def __init__(self, choice: KernelChoice, max_key_blocks: int = MAX_GRID_Y, max_blocks: int | None = None) -> None:
        if choice.direction != BACKWARD:
            raise ValueError(f"BackwardKernels runs backward choices (choose_backward), not {choice.name}")
        self.choice = choice
        self.max_key_blocks = max_key_blocks
        self.max_blocks = max_blocks
        self.persistent = os.environ.get(PERSISTENT_ENV, "1") != "0"

    def local_patterns(self, q: Any, k: Any, v: Any, dout: Any, lse: Any, delta: Any, dq: Any, dk: Any, dv: Any,
                       patterns: Sequence[Any], causal: bool, scale: float,
                       shape: Sequence[int] | None = None, fresh_kv: bool = False) -> None:
        """Add the gradient terms of ``patterns`` (``Pattern`` or ``(segment, dilation)``, segments inside these
        (n, H, D) arrays) to ``dq``, ``dk``, ``dv``. ``lse``: the merged log-sum-exp of every pattern (n, H),
        ``delta``: rowsum(dout * out) (n, H). ``shape`` is read from ``q`` unless given (raw pointers).
        ``fresh_kv``: ``dk`` and ``dv`` hold no terms yet and what they hold is never read (``torch.empty``
        will do): the first pattern's launches store its terms where its keys are every row and the kernel
        can (:func:`stores_fresh_gradients`), otherwise ``dk`` and ``dv`` are zeroed first."""
        if shape is None and not hasattr(q, "shape"):
            raise ValueError("give shape=(n, H, D) with raw pointers")
        check_arrays(self.choice, shape, q=q, k=k, v=v, dout=dout, lse=lse, delta=delta, dq=dq, dk=dk, dv=dv)
        n, heads, d = (int(x) for x in (q.shape if shape is None else shape))
        launches = local_launches(patterns, causal, scale, n, heads, d)
        fresh = 0
        if fresh_kv:
            first = local_launches(patterns[:1], causal, scale, n, heads, d)
            if stores_fresh_gradients(self.choice, patterns, n, first):
                fresh = len(first)
            else:
                for x in (dk, dv):
                    zero_float32(x, n * heads * d)
        self.launch_each(launches, q, k, v, dout, lse, delta, dq, dk, dv, fresh=fresh)

    def launch_each(self, geometries: Sequence[dict], q: Any, k: Any, v: Any, dout: Any, lse: Any, delta: Any,
                    dq: Any, dk: Any, dv: Any, fresh: int = 0) -> None:
        """:meth:`launch` of each geometry in order, every one after the first that launched anything following
        it (``follows``: programmatic dependent launch); the first ``fresh`` store their dK and dV terms."""
        launched = False
        for i, geometry in enumerate(geometries):
            launched |= self.launch(q, k, v, dout, lse, delta, dq, dk, dv, **geometry, follows=launched,
                                    fresh=i < fresh)

    def launch(self, q: Any, k: Any, v: Any, dout: Any, lse: Any, delta: Any, dq: Any, dk: Any, dv: Any, *,
               qg: tuple, kg: tuple, vg: tuple, lg: tuple, segments: int, heads: int, mq: int, mk: int,
               shift: int | None, scale: float, head_dim: int, follows: bool = False, fresh: bool = False) -> bool:
        """One launch geometry (``launch.local_launches``' keyword arguments: base, segment, head and row
        strides in elements; dO and dQ addressed like Q, dK like K, dV like V, delta like L) over
        ``segments x heads`` problems, split into key chunks where needed. ``follows``: the last thing queued
        on the stream is a launch of this call (of the same inputs), whose end this one may overlap
        (``kernels.dependent_launch``); the key chunks after the first follow each other so. ``fresh``: the
        launch stores its dK and dV terms (every key row of its problems), the kernel's ``fresh`` (a variant with
        ``fresh_gradients`` only). A persistent configuration with more work items (problems x key blocks) than
        the GPU has SMs runs a grid of one block per SM that work through them (``items``). Returns whether it
        launched anything."""
        if segments == 0 or heads == 0 or mq == 0 or mk == 0:
            return False
        if head_dim != self.choice.head_dim:
            raise ValueError(f"the kernel was chosen for head_dim {self.choice.head_dim}, got {head_dim}")
        if not scale > 0:
            raise ValueError(f"the backward kernel needs scale > 0, got {scale}")
        chosen = launch_variant(self.choice, qg, kg, vg, shift)
        if fresh and not chosen.fresh_gradients:
            raise ValueError(f"{chosen.name} adds its dK and dV terms: it has no fresh launch")
        fn = compiled(chosen)
        pointers = tuple(np.uint64(device_pointer(x)) for x in (q, k, v, dout, lse, delta, dq, dk, dv))
        for i, (kc, vc, mc, sc) in enumerate(key_chunks(kg, vg, mk, shift, chosen.block_queries,
                                                          self.max_key_blocks)):
            grid = (segments * heads, -(-mc // chosen.block_queries))
            items = 0
            if chosen.persistent and self.persistent:
                blocks = self.max_blocks or multiprocessors(cupy_device())
                if grid[0] * grid[1] > blocks:       # more items than blocks: each block works through several
                    grid, items = (blocks, 1), grid[0] * grid[1]
            extra = ()
            if chosen.maps_argument:
                maps = tensor_maps(pointers, qg, kc, vc, mq, mc, heads, segments, head_dim) \
                    if chosen.tensor_maps else 0
                extra = (np.uint64(maps),)
            if chosen.fresh_gradients:
                extra += (np.int32(fresh), np.int64(items))
            args = (*pointers, *geometry_arguments(qg, kc, vc, lg, heads, mq, mc, sc, scale), *extra)
            fn(grid, (chosen.threads,), args, shared_mem=chosen.shared_bytes, follows=follows or i > 0)
        return True


def cupy_device() -> int:
    """The index of CuPy's current GPU."""
    import cupy

    return int(cupy.cuda.Device().id)


def launch_variant(choice: KernelChoice, qg: tuple, kg: tuple, vg: tuple, shift: int | None) -> Any:
    """The variant of ``choice`` a launch of these geometries runs: the first whose alignment its row offsets
    meet, among the causal candidates where ``shift`` is not None."""
    return choice.for_alignment(math.gcd(*qg, *kg, *vg, 16), causal=shift is not None)


def stores_fresh_gradients(choice: KernelChoice, patterns: Sequence[Any], n: int, first: Sequence[dict]) -> bool:
    """Whether the first of ``patterns``, launched as ``first`` (its ``local_launches``), can store its dK and dV
    terms into gradients that hold none yet, over ``n`` rows: its keys are every row of every head (dilation 1,
    segments that tile the ``n`` rows) and the kernel each of its launches runs has a fresh launch
    (``fresh_gradients``)."""
    if not patterns:
        return False
    return (tiles_rows(*segment_dilation(patterns[0]), n) and
            all(launch_variant(choice, g["qg"], g["kg"], g["vg"], g["shift"]).fresh_gradients for g in first))


def zero_float32(x: Any, count: int) -> None:
    """``count`` float32 elements at ``x`` (a GPU array, tensor or device pointer) set to zero on the current
    stream."""
    import cupy

    cupy.cuda.runtime.memsetAsync(device_pointer(x), 0, 4 * count, cupy.cuda.get_current_stream().ptr)


def tensor_maps(pointers: tuple, qg: tuple, kg: tuple, vg: tuple, mq: int, mk: int, heads: int, segments: int,
                head_dim: int) -> int:
    """Device address of the tensor maps of one launch (``pointers``: q, k, v, dout, lse, delta, dq, dk, dv; dQ and
    dO addressed like Q at ``qg``, dK like K at ``kg``, dV like V at ``vg``; ``mq`` query and ``mk`` key rows): the
    float32 ``dq`` (``tma.accumulator_map``), the 16-bit ``q`` and ``dout`` in boxes of one query tile
    (``tma.query_tile_map``), the float32 ``dk`` and ``dv``; built once per launch and device (:func:`_tensor_maps`,
    keyed by the plain numbers, so that a launch seen before costs one dictionary look-up)."""
    import cupy

    q, _, _, dout, _, _, dq, dk, dv = (int(p) for p in pointers)
    maps = _tensor_maps(cupy.cuda.Device().id, q, dout, dq, dk, dv, tuple(int(x) for x in qg),
                        tuple(int(x) for x in kg), tuple(int(x) for x in vg), int(mq), int(mk), int(heads),
                        int(segments), int(head_dim))
    return int(maps.data.ptr)


@lru_cache(maxsize=1024)
def _tensor_maps(device: int, q: int, dout: int, dq: int, dk: int, dv: int, qg: tuple, kg: tuple, vg: tuple,
                 mq: int, mk: int, heads: int, segments: int, head_dim: int) -> Any:
    """The device array of :func:`tensor_maps`' maps (held here as long as the entry: its address is handed out)."""
    from hilbert_hpc.kernels import tma

    geometries = (tma.accumulator_map(dq, qg, mq, heads, segments, head_dim),
                  tma.query_tile_map(q, qg, mq, heads, segments, head_dim),
                  tma.query_tile_map(dout, qg, mq, heads, segments, head_dim),
                  tma.accumulator_map(dk, kg, mk, heads, segments, head_dim),
                  tma.accumulator_map(dv, vg, mk, heads, segments, head_dim))
    return tma.device_maps(device, geometries)


class RingBackwardKernels:
    """The ring backward's block provider (``distributed.ring_backward.HostBlockBackward``'s methods) on the
    backward kernels: gradients and accumulator blocks in float32, 16-bit inputs as torch tensors or as the
    raw bits of the choice's dtype (int16 arrays, the ``view`` of the backend's ``ring_side``)."""

    def __init__(self, kernels: BackwardKernels) -> None:
        self.kernels = kernels

    def accumulator_dtype(self, dtype: Any) -> Any:
        """float32: the kernels add every term into float32 gradients, whatever the inputs' dtype."""
        return np.dtype(np.float32)

    def row_delta(self, dout: Any, out: Any) -> Any:
        """``delta = rowsum(dO * O)`` (L, H) in float32, from the real values of ``dout`` and ``out`` (16 bits:
        torch tensors or raw bits), a chunk of rows at a time (the float32 temporaries stay small)."""
        return row_dot(dout, out, self.kernels.choice.dtype)

    def local_backward(self, qs: Any, ks: Any, vs: Any, out: Any, lse: Any, dout: Any, delta: Any,
                       patterns: Sequence[Any], causal: bool, scale: float,
                       into: tuple[Any, Any, Any] | None = None) -> tuple[Any, Any, Any]:
        """float32 gradients (dQ, dK, dV) of the shard's local ``patterns`` (zeros without any), arrays of the
        module of ``qs`` (CuPy; the shard's bits for 16 bits); added into ``into`` when given (returned)."""
        xp = array_module(qs)
        grads = into or tuple(xp.zeros(tuple(x.shape), dtype=np.float32) for x in (qs, ks, vs))
        if patterns:
            self.kernels.local_patterns(qs, ks, vs, dout, lse, delta, *grads, patterns, causal, scale)
        return grads

    def ring_block(self, qs: Any, dout: Any, lse: Any, delta: Any, block: Any, partial: Any, geom: Any, pos: int,
                   src: int, pair: Any, scale: float, dq: Any) -> None:
        """Terms of this rank's queries of piece ``pair.query`` against piece ``pair.key`` of ``src``'s packed
        K/V ``block``, launched in place: dQ into the shard's ``dq``, dK/dV into the accumulator block
        ``partial`` at the offsets of K/V in ``block`` (``geom``: a ``distributed.ring.RingPattern``)."""
        n, heads, d = (int(x) for x in qs.shape)
        self.kernels.launch_each(hop_launches(geom, pos, src, pair, float(scale), heads, d), qs, block, block, dout,
                                 lse, delta, dq, partial, partial)

    def gathered(self, qs: Any, dout: Any, lse: Any, delta: Any, sequence: Any, terms: Any, gather: Any,
                 scale: float, dq: Any) -> None:
        """Terms of this rank's queries against a gathered pattern's rows in sequence order
        (``distributed.gather.GatherPattern``): dQ into the shard's ``dq``, dK/dV into ``terms`` (float32, the
        layout of ``sequence``)."""
        n, heads, d = (int(x) for x in qs.shape)
        self.kernels.launch_each(gather.launches(scale, heads, d), qs, sequence, sequence, dout, lse, delta, dq,
                                 terms, terms)


def row_dot(a: Any, b: Any, dtype: str | None = None) -> Any:
    """rowsum(a * b) over the last dimension of (N, H, D) arrays in float32: of torch tensors a torch tensor; of
    NumPy or CuPy arrays an array of their module, 16-bit raw bits (int16 / uint16) read as values of ``dtype``
    ('bfloat16', 'float16'). GPU arrays take one pass of the ``row_dot`` kernel (row_dot.cu); host arrays a
    chunk of rows at a time (the float32 temporaries stay small beside the arrays)."""
    if on_gpu(a):
        return _row_dot_kernel(a, b, dtype)
    n, heads, d = (int(x) for x in a.shape)
    step = max(1, ROW_DOT_CHUNK // max(1, heads * d))
    if is_tensor(a):
        import torch

        out = torch.empty((n, heads), dtype=torch.float32, device=a.device)
        for r in range(0, n, step):
            out[r:r + step] = (a[r:r + step].float() * b[r:r + step].float()).sum(-1)
        return out
    out = array_module(a).empty((n, heads), dtype=np.float32)
    for r in range(0, n, step):
        rows = slice(r, r + step)
        out[rows] = (_float32_rows(a, dtype, rows) * _float32_rows(b, dtype, rows)).sum(-1)
    return out


#: the row_dot kernels: (element type, elements a load) of every instantiation (row_dot.cu)
ROW_DOT_TYPES = {FLOAT32: "float", **SIXTEEN_BIT_TYPES}
ROW_DOT_VECTOR = {FLOAT32: 4, "bfloat16": 8, "float16": 8}
ROW_DOT_PROGRAM = Program("row_dot.cu", tuple(f"row_dot<{t},{v}>" for name, t in ROW_DOT_TYPES.items()
                                              for v in (1, ROW_DOT_VECTOR[name])))
ROW_DOT_THREADS = 256


def _row_dot_kernel(a: Any, b: Any, dtype: str | None) -> Any:
    """:func:`row_dot` of two C-contiguous GPU arrays of one shape, in one kernel on the current stream."""
    n, heads, d = (int(x) for x in a.shape)
    if tuple(b.shape) != tuple(a.shape):
        raise ValueError(f"row_dot of arrays of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if not (is_c_contiguous(a) and is_c_contiguous(b)):
        raise ValueError("row_dot needs C-contiguous arrays")
    size = itemsize(a)
    name = dtype if size == 2 and dtype is not None else dtype_name(a.dtype)
    if is_tensor(a):
        import torch

        out = torch.empty((n, heads), dtype=torch.float32, device=a.device)
    else:
        out = array_module(a).empty((n, heads), dtype=np.float32)
    rows = n * heads
    if rows == 0:
        return out
    pa, pb = device_pointer(a), device_pointer(b)
    vec = ROW_DOT_VECTOR[name]
    if (d * size) % 16 or pa % 16 or pb % 16:
        vec = 1
    blocks = max(1, min(-(-rows * 8 // ROW_DOT_THREADS), 1 << 16))
    import cupy

    with cupy.cuda.Device(a.device.index if is_tensor(a) else a.device.id):    # the arrays' GPU
        fn = load(ROW_DOT_PROGRAM).function(f"row_dot<{ROW_DOT_TYPES[name]},{vec}>")
        fn((blocks,), (ROW_DOT_THREADS,), (np.uint64(pa), np.uint64(pb), np.uint64(device_pointer(out)),
                                            np.int64(rows), np.int32(d)))
    return out


def _float32_rows(x: Any, dtype: str | None, rows: slice) -> Any:
    """Rows of a NumPy or CuPy array as float32 values: with ``dtype`` ('bfloat16', 'float16') the raw bits
    (int16 / uint16) of such an array decoded; any other array converted."""
    part = x[rows]
    xp = array_module(part)
    if dtype is not None and part.dtype.kind in "iu" and part.dtype.itemsize == 2:
        if dtype == "bfloat16":
            return (part.view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)
        return part.view(xp.float16).astype(xp.float32)
    return xp.asarray(part, dtype=xp.float32)
