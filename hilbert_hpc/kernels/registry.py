"""The kernel registry: one description (:class:`KernelFamily`) per kernel family, read by selection
(:mod:`hilbert_hpc.kernels.selection`), by the compile check (:mod:`hilbert_hpc.kernels.check`), by the tests
and by ``plan``.

A family is one ``.cu`` source template: how an instantiation is spelled from the element type, the head
dimension and the family's configuration (its template arguments after those two), what one block of it
needs (threads, queries, shared memory), which rows it can read (alignment), which GPUs run it (compute
capability range, architecture-specific target such as ``sm_90a``), and per head dimension the default
configuration and the alternatives CI compiles and ``tests/scripts/*_probe.py --sweep`` time.

FP32 families (float32 inputs): ``wgmma_ws`` (split-TF32 warpgroup MMA fed by a producer warpgroup, Hopper),
``wgmma`` (the same products, every thread staging and splitting the tiles, Hopper), ``tf32x3`` (split-TF32
``mma.sync``, compute capability 8.0+), ``tiled128`` / ``tiled64`` (register-tiled FP32 FMA) and ``warp``
(FP32 FMA, any row alignment). 16-bit families (bfloat16, float16): ``tma16`` (warp-specialized, TMA loads,
Hopper), ``wgmma16`` (Hopper) and ``mma16`` (``mma.sync``, compute capability 8.0+). Backward families
(``direction`` "backward", never picked by the forward selection), preferred first: ``wgmma16_bwd`` (16-bit,
warpgroup MMA, Hopper), ``mma16_bwd`` (16-bit, ``mma.sync``, compute capability 8.0+), ``tf32x3_bwd`` (float32,
split-TF32 ``mma.sync``, compute capability 8.0+) and ``fma_bwd`` (FP32 FMA, every dtype, any row alignment). ``docs/kernels.md`` describes each and the measurements behind the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .tma import region_columns

FLOAT32 = "float32"
#: 16-bit dtype name -> the kernels' 16-bit storage type (template argument T)
SIXTEEN_BIT_TYPES = {"bfloat16": "bf16_t", "float16": "f16_t"}
#: other spellings accepted for a 16-bit dtype
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "f16": "float16", "half": "float16"}
#: opt-in shared memory per block on compute capability 9.0, the only GPU of the sm_90a families
HOPPER_SHARED = 227 * 1024
#: the architecture-specific target of the Hopper families
HOPPER_ARCH = "sm_90a"
HEAD_DIMS = (32, 64, 96, 128)
#: what a family computes: the attention (and its log-sum-exp merge) or the gradients of it
FORWARD, BACKWARD = "forward", "backward"


@dataclass(frozen=True)
class Variant:
    """One instantiation of a family: what to compile and how to launch it."""

    variant: str
    head_dim: int
    source: str
    name: str
    threads: int
    block_queries: int
    shared_bytes: int
    #: row offsets must be multiples of this many elements
    align: int
    #: oldest compute capability (major * 10 + minor) it runs on
    min_cc: int = 60
    #: newest compute capability it runs on (architecture-specific code, e.g. sm_90a: 90)
    max_cc: int = 1000
    #: NVRTC target of an architecture-specific variant; None: the device's own sm_XY
    arch: str | None = None
    #: the variant's configuration (its template arguments after the type and head dim), for its launcher
    config: tuple = ()
    #: a backward kernel whose last argument is a pointer to the tensor maps of a launch (``backward.tensor_maps``:
    #: dq, q, dout), and one that reads them (the others are given a null pointer)
    maps_argument: bool = False
    tensor_maps: bool = False
    #: launches of it that follow one another may overlap (programmatic dependent launch, compute capability 9.0+)
    dependent_launch: bool = False
    #: a backward kernel whose last arguments (after the maps) are the int ``fresh`` (not 0: dk and dv hold no
    #: terms yet and are stored, not added to; ``backward.BackwardKernels.local_patterns``' ``fresh_kv``) and the
    #: work items' count ``items``; and one whose blocks work through several items when ``items`` > 0 (a
    #: persistent grid, ``backward.BackwardKernels.launch``)
    fresh_gradients: bool = False
    persistent: bool = False

    def runs_on(self, cc: int) -> bool:
        """Whether a GPU of compute capability ``cc`` (major * 10 + minor) can run this variant."""
        return self.min_cc <= cc <= self.max_cc


Config = tuple


@dataclass(frozen=True)
class KernelFamily:
    """Everything the package knows about one kernel family (see the module docstring)."""

    name: str
    source: str
    #: dtypes of the inputs it takes
    dtypes: tuple[str, ...]
    #: the instantiation's name expression from (storage type, head dim, configuration, output type)
    template: Callable[[str, int, Config, str], str]
    #: names of the configuration's fields (its template arguments after T and D), as the override spells them
    config_fields: tuple[str, ...]
    #: dynamic shared memory of one block, from (head dim, configuration)
    shared_bytes: Callable[[int, Config], int]
    threads: Callable[[Config], int]
    block_queries: Callable[[int, Config], int]
    align: int
    #: default configuration per head dimension (its keys are the head dims the family supports)
    defaults: dict[int, Config]
    #: other configurations per head dimension, compiled in CI and timed by the probe scripts' sweeps
    alternatives: dict[int, tuple[Config, ...]] = field(default_factory=dict)
    #: backward: the configuration causal launches take first, per head dimension where it is not the default
    causal_defaults: dict[int, Config] = field(default_factory=dict)
    min_cc: int = 60
    max_cc: int = 1000
    arch: str | None = None
    #: largest shared memory per block on every GPU it runs on (architecture-specific: Hopper's); None: the device's
    max_shared: int | None = None
    #: whether it has an instantiation merging into a float32 running output (tma16), compiled for each default
    float32_output: bool = False
    #: whether a configuration is one the source supports (a forced configuration is checked against it)
    valid: Callable[[Config], bool] = lambda cfg: True
    #: FORWARD (DILATED_FWD_PARAMS) or BACKWARD (DILATED_BWD_PARAMS, block_queries: keys per block)
    direction: str = FORWARD
    #: whether its kernels take a pointer to tensor maps (dq, q, dout) after DILATED_BWD_PARAMS (wgmma16_bwd), and
    #: whether a configuration's kernel reads them (DQ = 1 or LOAD = 1; the others are given a null pointer)
    maps_argument: bool = False
    tensor_maps: Callable[[Config], bool] = lambda cfg: False
    #: whether its kernels support programmatic dependent launch (backward.cuh: allow_next_launch at the start,
    #: wait_for_previous_launch before what an earlier launch of the same call writes)
    dependent_launch: bool = False
    #: whether its kernels take ``fresh``: a launch that stores its dK and dV terms instead of adding them; and
    #: the work items' count ``items`` after it, with which a configuration's blocks (``persistent``) work through
    #: several items each
    fresh_gradients: bool = False
    persistent: Callable[[int, Config], bool] = lambda head_dim, cfg: False

    @property
    def head_dims(self) -> tuple[int, ...]:
        """The head dimensions this family has an instantiation for."""
        return tuple(self.defaults)

    def configurations(self, head_dim: int, causal: bool = False) -> list[Config]:
        """The default, causal default and alternative configurations for ``head_dim``, without repeats: the
        default first, or for ``causal`` launches the causal default where there is one."""
        default = self.defaults[head_dim]
        causal_default = self.causal_defaults.get(head_dim, default)
        first, second = (causal_default, default) if causal else (default, causal_default)
        return list(dict.fromkeys([first, second, *self.alternatives.get(head_dim, ())]))

    def variant(self, head_dim: int, dtype: Any = FLOAT32, config: Config | None = None,
                accumulate: bool = False) -> Variant:
        """The instantiation for ``head_dim`` and ``dtype`` with ``config`` (default: the head dim's default);
        ``accumulate``: the one merging into a float32 running output (families with ``float32_output``)."""
        if head_dim not in self.defaults:
            raise ValueError(f"{self.name} supports head_dim in {list(self.head_dims)}, got {head_dim}")
        name = dtype_name(dtype)
        if name not in self.dtypes:
            raise ValueError(f"{self.name} takes dtype {' or '.join(self.dtypes)}, got {dtype!r}")
        cfg = tuple(int(x) for x in (self.defaults[head_dim] if config is None else config))
        if len(cfg) != len(self.config_fields) or not self.valid(cfg):
            raise ValueError(f"{self.name} configuration ({', '.join(self.config_fields)}) = {cfg} is not supported")
        if accumulate and not self.float32_output:
            raise ValueError(f"{self.name} has no float32 running output")
        t = SIXTEEN_BIT_TYPES.get(name, "float")
        return Variant(self.name, head_dim, self.source, self.template(t, head_dim, cfg, "float" if accumulate else t),
                       self.threads(cfg), self.block_queries(head_dim, cfg), self.shared_bytes(head_dim, cfg),
                       self.align, self.min_cc, self.max_cc, self.arch, cfg, self.maps_argument,
                       self.tensor_maps(cfg), self.dependent_launch, self.fresh_gradients,
                       self.persistent(head_dim, cfg))

    def instantiations(self) -> list[Variant]:
        """Every instantiation CI compiles: each dtype and head dim with each configuration, then the
        float32-output instantiation of each default."""
        out = [self.variant(d, t, cfg) for t in self.dtypes for d in self.head_dims for cfg in self.configurations(d)]
        if self.float32_output:
            out += [self.variant(d, t, accumulate=True) for t in self.dtypes for d in self.head_dims]
        return out


def dtype_name(dtype: Any) -> str:
    """'float32', 'bfloat16' or 'float16' for a dtype given as a string, a torch dtype or a NumPy dtype."""
    name = str(getattr(dtype, "name", None) or dtype).replace("torch.", "").lower()
    name = _ALIASES.get(name, name)
    if name != FLOAT32 and name not in SIXTEEN_BIT_TYPES:
        raise ValueError(f"the fused kernels take dtype float32, bfloat16 or float16, got {dtype!r}")
    return name


# ---- FP32 families --------------------------------------------------------------------------------------

WARPS = 4
KEY_TILE = 32
TILED_KEYS = 64
MMA_WARPS = 4
MMA_KEYS = 32


def _warp_shared(d: int, cfg: Config) -> int:
    """Q of the block's queries, two K/V key tiles with padded rows, the scores (fits Pascal's 48 KiB)."""
    bq = WARPS * cfg[0]
    return 4 * (bq * d + 2 * KEY_TILE * (d + 1) + bq * KEY_TILE)


def _tiled_shared(d: int, cfg: Config) -> int:
    bq = cfg[0]
    return 4 * (d * bq + max(d * TILED_KEYS, TILED_KEYS * bq) + TILED_KEYS * d)


def _wgmma_floats(d: int, keys: int, warpgroups: int) -> tuple[int, int, int, int]:
    """Floats of the wgmma blocks' parts (WgmmaSmem in dilated_fwd_wgmma_tf32.cu): one of Q hi / lo, one of K hi /
    lo / raw K staging, one of V^T hi / lo (8-row groups padded by 16 bytes), the raw V staging ([key][D + 4])."""
    return 64 * warpgroups * d, keys * d, (d // 8) * (32 * keys + 16) // 4, keys * (d + 4)


def wgmma_shared_bytes(head_dim: int, keys: int, warpgroups: int) -> int:
    """Dynamic shared memory of the wgmma variant (WgmmaSmem in dilated_fwd_wgmma_tf32.cu)."""
    q, kv, vt, vs = _wgmma_floats(head_dim, keys, warpgroups)
    return 4 * (2 * q + 3 * kv + 2 * vt + vs)


WARP = KernelFamily(
    "warp", "dilated_fwd_fp32.cu", (FLOAT32,), lambda t, d, c, o: f"dilated_fwd_fp32<{d},{c[0]}>", ("QPW",),
    _warp_shared, lambda c: WARPS * 32, lambda d, c: WARPS * c[0], 1,
    # queries per warp
    defaults={32: (8,), 64: (8,), 96: (4,), 128: (4,)})


def _tiled(bq: int) -> KernelFamily:
    return KernelFamily(
        f"tiled{bq}", "dilated_fwd_fp32_tiled.cu", (FLOAT32,), lambda t, d, c, o: f"dilated_fwd_fp32_tiled<{d},{c[0]}>",
        ("BQ",), _tiled_shared, lambda c: 256, lambda d, c: c[0], 4, defaults={d: (bq,) for d in HEAD_DIMS},
        valid=lambda c: c == (bq,))


TILED128, TILED64 = _tiled(128), _tiled(64)
TF32X3 = KernelFamily(
    "tf32x3", "dilated_fwd_tf32x3.cu", (FLOAT32,), lambda t, d, c, o: f"dilated_fwd_tf32x3<{d}>", (),
    # Q and two K/V tiles, rows padded by 4
    lambda d, c: 4 * (16 * MMA_WARPS + 2 * 2 * MMA_KEYS) * (d + 4), lambda c: 32 * MMA_WARPS,
    lambda d, c: 16 * MMA_WARPS, 4, defaults={d: () for d in HEAD_DIMS}, min_cc=80)
#: wgmma per head dim: (key tile BK, warpgroups of 64 queries per block, column parts of P V); no spills with
#: ptxas for sm_90a (tests/test_kernel_sources.py), chosen by the sweep of docs/performance.md
WGMMA = KernelFamily(
    "wgmma", "dilated_fwd_wgmma_tf32.cu", (FLOAT32,), lambda t, d, c, o: f"dilated_fwd_wgmma_tf32<{d},{c[0]},{c[1]},{c[2]}>",
    ("BK", "WG", "PARTS"), lambda d, c: wgmma_shared_bytes(d, c[0], c[1]), lambda c: 128 * c[1],
    lambda d, c: 64 * c[1], 4, defaults={32: (64, 1, 1), 64: (64, 2, 1), 96: (32, 2, 1), 128: (32, 2, 2)},
    min_cc=90, max_cc=90, arch=HOPPER_ARCH, max_shared=HOPPER_SHARED,
    valid=lambda c: c[0] % 16 == 0 and c[1] in (1, 2) and c[2] in (1, 2))


def wgmma_ws_shared_bytes(head_dim: int, keys: int, warpgroups: int, stages: int) -> int:
    """Dynamic shared memory of a warp-specialized wgmma block (WgmmaStages in dilated_fwd_wgmma_tf32.cu): Q hi/lo,
    ``stages`` split stages (K hi/lo, V^T hi/lo), the producer's raw K and V staging, 2 ``stages`` mbarriers."""
    q, kv, vt, vs = _wgmma_floats(head_dim, keys, warpgroups)
    return 4 * (2 * q + stages * (2 * kv + 2 * vt) + kv + vs) + 16 * stages


#: wgmma_ws: wgmma fed by a producer warpgroup splitting the tiles into STAGES stages for WG consumer warpgroups (BK,
#: WG, PARTS as wgmma's); first on Hopper: 1.10-1.16x wgmma at every head dim (docs/performance.md sweep)
WGMMA_WS = KernelFamily(
    "wgmma_ws", "dilated_fwd_wgmma_tf32.cu", (FLOAT32,),
    lambda t, d, c, o: f"dilated_fwd_wgmma_tf32<{d},{c[0]},{c[1]},{c[2]},{c[3]}>",
    ("BK", "WG", "PARTS", "STAGES"), lambda d, c: wgmma_ws_shared_bytes(d, c[0], c[1], c[3]),
    lambda c: 128 * (c[1] + 1), lambda d, c: 64 * c[1], 4,
    defaults={32: (128, 2, 1, 2), 64: (64, 2, 1, 2), 96: (32, 2, 2, 2), 128: (32, 2, 2, 1)},
    min_cc=90, max_cc=90, arch=HOPPER_ARCH, max_shared=HOPPER_SHARED,
    valid=lambda c: c[0] % 16 == 0 and c[1] in (1, 2) and c[2] in (1, 2) and c[3] >= 1)

# ---- 16-bit families ------------------------------------------------------------------------------------

SIXTEEN_BIT = tuple(SIXTEEN_BIT_TYPES)
#: rows (and every geometry offset) of the 16-bit kernels must be multiples of this many elements (16-byte cp.async)
SIXTEEN_BIT_ALIGN = 8


def wgmma16_shared_bytes(head_dim: int, keys: int, warpgroups: int, vmode: int = 0) -> int:
    """Dynamic shared memory of one wgmma16 block (Smem16 in dilated_fwd_wgmma_16.cu): Q, two K/V stages, V^T."""
    tile = 2 * keys * head_dim
    return 2 * 64 * warpgroups * head_dim + 4 * tile + (tile if vmode == 1 else 0)


def tma16_shared_bytes(head_dim: int, keys: int, consumers: int, stages: int) -> int:
    """Dynamic shared memory of one tma16 block (SmemTma in dilated_fwd_tma_16.cu): Q of the consumer
    warpgroups, the K/V stages (rows of the head dim rounded up to whole regions: 64 columns, or 32 at head
    dim 32), the mbarriers, the slot of the next item's number and 1024 bytes that align the base for the
    swizzle."""
    region = region_columns(head_dim)
    padded = -(-head_dim // region) * region
    return 2 * 64 * consumers * padded + 2 * stages * 2 * keys * padded + 8 * (3 + 4 * stages) + 1024


def mma16_shared_bytes(head_dim: int, keys: int) -> int:
    """Dynamic shared memory of one mma16 block: Q (64 rows) and two K/V stages, rows padded to D + 8."""
    return 2 * (head_dim + 8) * (64 + 4 * keys)


#: per head dim: (key tile BK, warpgroups of 64 queries per block, V mode), template arguments of
#: dilated_fwd_wgmma_16<T, D, BK, WG, VMODE>. V mode 0: V read as MN-major B (wgmma imm-trans-b = 1,
#: no extra work); 1: V transposed once per tile into a K-major V^T buffer (ldmatrix/stmatrix.trans).
#: With BK = 64 and D <= 64 a block is held to 128 registers (two 8-warp blocks per SM). No spills with
#: ptxas for sm_90a (tests/test_kernel16_sources.py). Measured on an H200 (N = 262,144, patterns (2048,1)
#: (4096,2) (8192,4), bf16, ms non-causal / causal): D = 64 (H = 12): (64, 2, 0) 12.54 / 7.98 (two blocks
#: per SM), (128, 2, 1) 15.88 / 9.94, (128, 2, 0) 16.29, (192, 2, 0) 15.71, (64, 1, 0) 20.22 (four blocks),
#: (64, 1, 1) 20.39; D = 128 (H = 8): (128, 2, 0) 16.3-17.3 / 9.9, (128, 2, 1) 17.88, (64, 2, 0) 17.93.
#: D = 32 and 96: not timed yet.
WGMMA16 = KernelFamily(
    "wgmma16", "dilated_fwd_wgmma_16.cu", SIXTEEN_BIT,
    lambda t, d, c, o: f"dilated_fwd_wgmma_16<{t},{d},{c[0]},{c[1]},{c[2]}>", ("BK", "WG", "VMODE"),
    lambda d, c: wgmma16_shared_bytes(d, *c), lambda c: 128 * c[1], lambda d, c: 64 * c[1], SIXTEEN_BIT_ALIGN,
    defaults={32: (128, 2, 0), 64: (64, 2, 0), 96: (128, 2, 0), 128: (128, 2, 0)},
    alternatives={32: ((128, 2, 1), (64, 2, 0)),
                  64: ((128, 2, 1), (128, 2, 0), (192, 2, 0), (64, 1, 0), (64, 1, 1)),
                  96: ((128, 2, 1), (64, 2, 0)),
                  128: ((128, 2, 1), (64, 2, 0))},
    min_cc=90, max_cc=90, arch=HOPPER_ARCH, max_shared=HOPPER_SHARED,
    valid=lambda c: c[0] % 16 == 0 and 16 <= c[0] <= 256 and c[1] in (1, 2) and c[2] in (0, 1))
#: key tiles of tma16 (the wgmma m64nNk16 widths of Wgmma16 in wgmma.cuh)
TMA16_KEY_TILES = (32, 64, 96, 128, 192)
#: per head dim (rows of one or two 128-byte swizzle spans; 32 and 96 computed as 64 and 128 columns of which
#: the copy engine zero-fills the last 32): (key tile BK, consumer warpgroups NC,
#: stages, PIPE, LAZY, PINGPONG, PERSISTENT), template arguments of dilated_fwd_tma_16<T, D, BK, NC, STAGES, PIPE,
#: LAZY, PINGPONG, PERSISTENT, OUT>; PIPE = 1 overlaps the next tile's Q K^T with the softmax, LAZY = 1 rescales the
#: running output only when a row's max grows by more than 2^8 (attention.cuh), PINGPONG = 1 has the consumer
#: warpgroups take turns issuing their products, PERSISTENT = 1 launches one block per SM that takes query blocks
#: from a counter until none is left (causal launches too since 2026-11-27; before, a static round robin that
#: causal launches did not use, kernels/sixteen_bit.py). Timings of these and the other configurations tried:
#: docs/performance.md, section "configuration sweeps of the Hopper 16-bit kernels". Three consumers with BK = 128
#: and PIPE = 1 spill (ptxas allocates within what setmaxnreg gives the consumers: 160 registers). Four consumers
#: (640 threads) get 112: the persistent walk's state spills there, and since the merge's prefetch (its rows' old
#: log-sum-exp held through the mainloop) so do the PINGPONG configurations; none is listed. NC >= 2: with one
#: consumer the launch bound already gives it more registers than setmaxnreg may raise it to.
TMA16 = KernelFamily(
    "tma16", "dilated_fwd_tma_16.cu", SIXTEEN_BIT,
    lambda t, d, c, o: f"dilated_fwd_tma_16<{t},{d},{c[0]},{c[1]},{c[2]},{c[3]},{c[4]},{c[5]},{c[6]},{o}>",
    ("BK", "NC", "STAGES", "PIPE", "LAZY", "PINGPONG", "PERSISTENT"),
    lambda d, c: tma16_shared_bytes(d, c[0], c[1], c[2]), lambda c: 128 * (c[1] + 1), lambda d, c: 64 * c[1],
    SIXTEEN_BIT_ALIGN, defaults={32: (128, 3, 2, 0, 1, 0, 1), 64: (128, 3, 2, 0, 1, 0, 1), 96: (128, 2, 2, 1, 1, 0, 1),
                                 128: (64, 3, 3, 1, 1, 0, 1)},
    alternatives={64: ((128, 3, 2, 0, 1, 1, 1), (128, 3, 2, 0, 1, 0, 0),
                       (96, 3, 3, 1, 1, 0, 1), (64, 3, 3, 1, 1, 0, 1), (128, 3, 3, 0, 1, 0, 0),
                       (192, 2, 2, 0, 1, 0, 0), (128, 2, 2, 0, 1, 0, 0), (128, 2, 2, 1, 1, 1, 0)),
                  32: ((64, 3, 3, 1, 1, 0, 1), (128, 3, 3, 0, 1, 0, 1),
                       (128, 3, 2, 0, 1, 0, 0)),
                  96: ((64, 3, 3, 1, 1, 0, 1), (64, 3, 3, 1, 1, 0, 0), (64, 3, 3, 1, 1, 1, 0), (64, 3, 3, 1, 0, 0, 0), (128, 2, 2, 0, 1, 0, 0),
                       (64, 2, 3, 1, 1, 0, 0)),
                  128: ((128, 2, 2, 0, 1, 1, 1), (128, 2, 2, 0, 1, 0, 0), (128, 2, 2, 0, 1, 1, 0), (128, 2, 2, 0, 1, 0, 1),
                        (128, 2, 2, 0, 0, 0, 0),
                        (64, 3, 3, 1, 1, 0, 0), (128, 2, 3, 0, 1, 0, 0), (64, 2, 3, 1, 1, 0, 0), (128, 2, 2, 1, 1, 0, 0))},
    min_cc=90, max_cc=90, arch=HOPPER_ARCH, max_shared=HOPPER_SHARED, float32_output=True,
    valid=lambda c: c[0] in TMA16_KEY_TILES and c[1] in (2, 3, 4) and 2 <= c[2] <= 8 and c[3] in (0, 1)
    and c[4] in (0, 1) and c[5] in (0, 1) and c[6] in (0, 1))
#: mma16 key tile per head dim (4 warps x 16 queries per block); shared memory 2 (D + 8) (64 + 4 BK) bytes:
#: D = 128 with BK = 32 keeps two blocks per SM on compute capability 8.0 and fits 8.6/8.9's 99 KiB. The
#: alternatives are compiled in CI (the mma16 kernel has not been timed on a GPU of compute capability 8.x).
MMA16 = KernelFamily(
    "mma16", "dilated_fwd_mma_16.cu", SIXTEEN_BIT, lambda t, d, c, o: f"dilated_fwd_mma_16<{t},{d},{c[0]}>", ("BK",),
    lambda d, c: mma16_shared_bytes(d, c[0]), lambda c: 128, lambda d, c: 64, SIXTEEN_BIT_ALIGN,
    defaults={32: (64,), 64: (64,), 96: (32,), 128: (32,)},
    alternatives={32: ((32,),), 64: ((32,),), 96: ((64,),), 128: ((64,),)},
    # oldest compute capability with bf16/fp16 mma.sync m16n8k16
    min_cc=80, valid=lambda c: c[0] % 16 == 0 and 16 <= c[0] <= 128)

# ---- backward families ----------------------------------------------------------------------------------

BWD_WARPS = 4


def fma_bwd_shared_bytes(head_dim: int, keys: int, queries: int) -> int:
    """Dynamic shared memory of one fma_bwd block (dilated_bwd_fma.cu): K and V of its keys (rows padded to
    D + 1), Q and dO of a query tile, its P and dS, L and delta (float32)."""
    return 4 * (2 * keys * (head_dim + 1) + 2 * queries * head_dim + 2 * queries * keys + 2 * queries)


def mma16_bwd_shared_bytes(head_dim: int, keys: int) -> int:
    """Dynamic shared memory of one mma16_bwd block (dilated_bwd_mma_16.cu): K and V of its keys, Q and dO of
    two query-tile stages (rows padded to D + 8), dS^T in 16 bits, L and delta of two stages; the query tile
    is 64 rows for D <= 64, 32 above."""
    queries = 64 if head_dim <= 64 else 32
    return 4 * (head_dim + 8) * (keys + 2 * queries) + 2 * keys * (queries + 8) + 16 * queries


def wgmma16_bwd_persistent(head_dim: int, cfg: Config) -> bool:
    """Whether a wgmma16_bwd configuration's blocks can work through several items (BwdConfig::LOOP in
    dilated_bwd_wgmma_16.cu: LOAD = 1, DQ = 1, PIPE = 2, DKV = 0, BQ = 64, D = 32 or 64; the next item's K and V
    staged into a second buffer by a producer warp). It and :func:`wgmma16_bwd_shared_bytes` mirror the kernel's
    BwdConfig, which tests/test_backward_kernels.py compiles static asserts against."""
    return cfg[4] == 1 and cfg[3] == 1 and cfg[1] == 2 and cfg[5] == 0 and cfg[6] == 64 and head_dim <= 64


def wgmma16_bwd_shared_bytes(head_dim: int, warpgroups: int, pipe: int, stages: int, dq: int = 0,
                             load: int = 0, dkv: int = 0, queries: int = 64) -> int:
    """Dynamic shared memory of one wgmma16_bwd block (BwdSmemWg in dilated_bwd_wgmma_16.cu): K and V of its
    64 NWG keys, Q, dO, L and delta of the ``stages`` stages of query tiles of ``queries`` rows (with ``load``
    whole regions of ``tma.region_columns``), two dS^T buffers in 16 bits, two mbarriers per stage (and with
    PIPE = 2 the dS^T handoff's), and with ``dq`` the float32 dQ tile and its two mbarriers (``dkv``: dK and dV
    are staged over K, V and the stages, no more), and a persistent configuration's K/V mbarriers and second K
    and V buffer (KVB in dilated_bwd_wgmma_16.cu)."""
    keys = 64 * warpgroups
    region = region_columns(head_dim)
    tile_columns = -(-head_dim // region) * region if load else head_dim
    dq_tile = 4 * queries * head_dim if dq else 0
    kv_bars = (4 * head_dim * keys + 4 * stages * tile_columns * queries + 4 * keys * queries + 8 * stages * queries
               + 16 * stages + (8 if pipe == 2 else 0) + (16 if dq else 0))      # OFF_KVBAR
    if not wgmma16_bwd_persistent(head_dim, (warpgroups, pipe, stages, dq, load, dkv, queries)):
        return kv_bars + dq_tile
    return -(-(kv_bars + 32) // 1024) * 1024 + 4 * head_dim * keys + dq_tile    # + K and V again (KVB = 2)


#: wgmma16_bwd per head dim: (warpgroups NWG, PIPE, STAGES, DQ, LOAD, DKV, BQ), template arguments of
#: dilated_bwd_wgmma_16<T, D, NWG, PIPE, STAGES, DQ, LOAD, DKV, BQ>: a warpgroup per 64 keys (BK = 64 NWG keys per
#: block), query tiles of BQ rows (64; 128 at D <= 64 with PIPE = 2 and LOAD = 1, an alternative, 0.94-0.99x);
#: NWG = 2 computing warpgroups and a producer warpgroup that fills STAGES (2 to 4) stages behind mbarriers;
#: PIPE = 1 computes a tile's dQ during the next tile's softmax, PIPE = 2 too, with the consumers handing dS^T over
#: through an mbarrier instead of a named barrier; DQ = 1 (PIPE = 2): dQ stored into a shared tile and added to dq
#: by a producer warp's TMA reduce-add instead of red.global.add; LOAD = 1: one producer thread loads Q and dO by
#: TMA (128-byte swizzle) instead of the producer's threads by cp.async; DKV = 1: dK and dV added to dk, dv by TMA
#: reduce-add from shared tiles instead of every consumer thread's read-add-write. No spills with ptxas for sm_90a
#: (D = 128 spills a few bytes at STAGES = 2 and 4, so those are not listed). Timings: docs/performance.md, section
#: "configuration sweeps of the Hopper 16-bit kernels". Causal launches take DKV = 1 (causal_defaults): the kernel
#: alone 1.02-1.07x faster causal (0.85-0.97x full), the causal backward end to end 1.01-1.06x (H200,
#: docs/performance.md). The defaults at D = 32 and 64 are persistent (``wgmma16_bwd_persistent``): a grid of one
#: block per SM working through the launch's items, the next item's K and V staged during this one's tiles.
WGMMA16_BWD = KernelFamily(
    "wgmma16_bwd", "dilated_bwd_wgmma_16.cu", SIXTEEN_BIT,
    lambda t, d, c, o: f"dilated_bwd_wgmma_16<{t},{d},{','.join(map(str, c))}>",
    ("NWG", "PIPE", "STAGES", "DQ", "LOAD", "DKV", "BQ"),
    lambda d, c: wgmma16_bwd_shared_bytes(d, *c), lambda c: 128 * (c[0] + 1),
    lambda d, c: 64 * c[0], SIXTEEN_BIT_ALIGN,
    defaults={32: (2, 2, 3, 1, 1, 0, 64), 64: (2, 2, 3, 1, 1, 0, 64), 96: (2, 2, 3, 1, 1, 0, 64),
              128: (2, 2, 3, 1, 1, 0, 64)},
    alternatives={32: ((2, 2, 3, 1, 1, 0, 128), (2, 2, 3, 1, 1, 1, 64), (2, 2, 3, 0, 1, 0, 64),
                       (2, 2, 3, 0, 0, 0, 64), (2, 1, 3, 0, 0, 0, 64)),
                  64: ((2, 2, 2, 1, 1, 0, 128), (2, 2, 3, 1, 1, 1, 64), (2, 2, 3, 0, 1, 0, 64),
                       (2, 2, 3, 0, 0, 0, 64), (2, 1, 3, 0, 0, 0, 64)),
                  96: ((2, 2, 3, 1, 1, 1, 64), (2, 2, 3, 0, 1, 0, 64), (2, 2, 3, 0, 0, 0, 64)),
                  128: ((2, 2, 3, 1, 1, 1, 64), (2, 2, 3, 0, 1, 0, 64), (2, 2, 3, 0, 0, 0, 64),
                        (2, 1, 3, 0, 0, 0, 64))},
    causal_defaults={d: (2, 2, 3, 1, 1, 1, 64) for d in (32, 64, 96, 128)},
    min_cc=90, max_cc=90, arch=HOPPER_ARCH, max_shared=HOPPER_SHARED,
    valid=lambda c: (c[0] == 2 and c[1] in (1, 2) and 2 <= c[2] <= 4 and c[3] in (0, 1) and (c[3] == 0 or c[1] == 2)
                     and c[4] in (0, 1) and c[5] in (0, 1)
                     and (c[6] == 64 or (c[6] == 128 and c[1] == 2 and c[4] == 1))),
    maps_argument=True, tensor_maps=lambda c: bool(c[3] or c[4] or c[5]), dependent_launch=True,
    fresh_gradients=True, persistent=wgmma16_bwd_persistent, direction=BACKWARD)

#: mma16_bwd per head dim: keys per block BK (a warp per 16 keys), template argument of
#: dilated_bwd_mma_16<T, D, BK>; no spills with ptxas for sm_80 and sm_90. Measured on an H100 (N = 262,144,
#: patterns (2048,1) (4096,2) (8192,4), bf16, useful TFLOP/s, BK = 128 / 64): D = 64 (H = 12) 191 / 126, causal
#: 168 / 117; D = 32 142 / 113; D = 96 184 / 124; D = 128 (H = 8) 198 / 129, causal 178 / 121. The backward
#: choice takes the first configuration that fits the GPU's shared memory: BK = 64 where D = 128's 115,200
#: bytes at BK = 128 do not (compute capability 8.6 / 8.9).
MMA16_BWD = KernelFamily(
    "mma16_bwd", "dilated_bwd_mma_16.cu", SIXTEEN_BIT, lambda t, d, c, o: f"dilated_bwd_mma_16<{t},{d},{c[0]}>",
    ("BK",), lambda d, c: mma16_bwd_shared_bytes(d, c[0]), lambda c: 2 * c[0], lambda d, c: c[0],
    SIXTEEN_BIT_ALIGN, defaults={d: (128,) for d in HEAD_DIMS}, alternatives={d: ((64,),) for d in HEAD_DIMS},
    min_cc=80, valid=lambda c: c[0] in (64, 128), dependent_launch=True, direction=BACKWARD)

def tf32x3_bwd_shared_bytes(head_dim: int, keys: int) -> int:
    """Dynamic shared memory of one tf32x3_bwd block (dilated_bwd_tf32x3.cu): K and V of its keys, Q and dO of
    two stages of 32-query tiles (float32 rows padded to D + 4), dS^T (rows padded to 36), L and delta."""
    return 8 * (head_dim + 4) * (keys + 64) + 4 * keys * 36 + 16 * 32


#: tf32x3_bwd per head dim: keys per block BK (a warp per 16 keys) of dilated_bwd_tf32x3<D, BK>. On an H200 with the
#: one-instruction TF32 rounding (N = 262,144, the anchor's patterns, ms BK = 128 / 64; docs/performance.md): D = 32
#: (H = 16) 152.8 / 111.7 (three blocks a SM); D = 64 (H = 12) 181.6 / 181.4; D = 96 (H = 8) 182.2 / 190.0; D = 128
#: (H = 8) 227.1 / 367.5. The backward choice takes the first configuration that fits the GPU's shared memory (D = 128
#: at BK = 128 needs 221,696 bytes: Hopper only).
TF32X3_BWD = KernelFamily(
    "tf32x3_bwd", "dilated_bwd_tf32x3.cu", (FLOAT32,), lambda t, d, c, o: f"dilated_bwd_tf32x3<{d},{c[0]}>",
    ("BK",), lambda d, c: tf32x3_bwd_shared_bytes(d, c[0]), lambda c: 2 * c[0], lambda d, c: c[0], 4,
    defaults={32: (64,), 64: (128,), 96: (128,), 128: (128,)},
    alternatives={32: ((128,),), 64: ((64,),), 96: ((64,),), 128: ((64,),)},
    min_cc=80, valid=lambda c: c[0] in (64, 128), dependent_launch=True, direction=BACKWARD)

#: per head dim: (keys per block BK, query tile BQ), template arguments of dilated_bwd_fma<T, D, BK, BQ>: dK and
#: dV of BK / 4 keys per thread in 2 D / 32 x BK / 4 <= 64 registers, every block within Pascal's 48 KiB. A
#: query's dQ row gets one atomicAdd per key block: larger BK, fewer atomics. Measured on an H100 (N = 262,144,
#: patterns (2048,1) (4096,2) (8192,4), ms non-causal / causal): D = 64 (H = 12): (64, 8) 349 / 179, (32, 16)
#: 351 / 178; D = 128 (H = 8): (32, 8) 507 / 256, (32, 4) 630 / 318. D = 32 and 96: not timed yet.
FMA_BWD = KernelFamily(
    "fma_bwd", "dilated_bwd_fma.cu", (FLOAT32, *SIXTEEN_BIT),
    lambda t, d, c, o: f"dilated_bwd_fma<{t},{d},{c[0]},{c[1]}>", ("BK", "BQ"),
    lambda d, c: fma_bwd_shared_bytes(d, *c), lambda c: 32 * BWD_WARPS, lambda d, c: c[0], 1,
    defaults={32: (128, 8), 64: (64, 8), 96: (32, 16), 128: (32, 8)},
    alternatives={32: ((64, 16),), 64: ((32, 16),), 96: ((32, 8),), 128: ((32, 4),)},
    valid=lambda c: c[0] in (32, 64, 128) and c[1] % BWD_WARPS == 0 and BWD_WARPS <= c[1] <= 32,
    direction=BACKWARD)

#: every family: the forward ones (FP32 fastest first, measured on an H200, docs/performance.md; then the 16-bit
#: ones), then the backward ones, preferred first (the backward choice takes the first that runs)
FAMILIES = {f.name: f for f in (WGMMA_WS, WGMMA, TF32X3, TILED128, TILED64, WARP, WGMMA16, TMA16, MMA16,
                                WGMMA16_BWD, MMA16_BWD, TF32X3_BWD, FMA_BWD)}


def family(name: str) -> KernelFamily:
    """The family called ``name`` (ValueError naming the known ones otherwise)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown kernel family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def families_for(dtype: Any, direction: str = FORWARD) -> list[KernelFamily]:
    """The families of ``direction`` (FORWARD or BACKWARD) that take ``dtype``, in the registry's order (FP32
    forward: fastest first; backward: preferred first)."""
    name = dtype_name(dtype)
    return [f for f in FAMILIES.values() if name in f.dtypes and f.direction == direction]


def check_head_dim(dtype: Any, head_dim: int) -> None:
    """ValueError where no kernel of ``dtype`` supports ``head_dim``."""
    name = dtype_name(dtype)
    dims = sorted({d for f in families_for(name) for d in f.head_dims})
    if head_dim in dims:
        return
    if name == FLOAT32:
        raise ValueError(f"the fused FP32 kernel supports head_dim in {dims}, got {head_dim}; "
                         f"use backend 'cupy' for other head dimensions")
    raise ValueError(f"the 16-bit kernel supports head_dim in {dims}, got {head_dim}")


def instantiations(families: Any = None) -> list[Variant]:
    """Every instantiation CI compiles, of ``families`` (names or families; default: all), in registry order."""
    chosen = FAMILIES.values() if families is None else [f if isinstance(f, KernelFamily) else family(f)
                                                         for f in families]
    return [v for f in chosen for v in f.instantiations()]
