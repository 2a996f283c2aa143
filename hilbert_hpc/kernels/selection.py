"""Which kernel runs: :func:`choose`, the one decision, made once per case, and its result :class:`KernelChoice`.

float32: the first family of the registry's FP32 order (``wgmma``, ``tf32x3``, ``tiled128``, ``tiled64``,
``warp``) that the GPU runs (compute capability; ``wgmma`` only on 9.0, since sm_90a code runs nowhere else)
and whose block fits its opt-in shared memory. Rows that are not aligned for it fall back, launch by launch,
to the next of those that reads them (:meth:`KernelChoice.for_alignment`: ``warp`` reads any rows).

16 bits (bfloat16, float16): on compute capability 9.0 ``tma16`` where it has the head dim (32, 64, 96, 128: all), else
``wgmma16``; ``mma16`` on other GPUs from 8.0; older GPUs are refused with a message that names the dtype and
the GPU's compute capability.

An override forces a family, optionally with a configuration (its template arguments, as the registry names
them): ``HILBERT_HPC_FP32_KERNEL`` for float32 (e.g. ``tf32x3``, ``wgmma:64,2,1``), ``HILBERT_HPC_HALF_KERNEL``
for the 16-bit kernels (``wgmma16``, ``wgmma16:BK,WG,VMODE``, ``tma16``, ``tma16:BK,NC,STAGES,PIPE,LAZY,PINGPONG,PERSISTENT``, ``mma16``
or ``mma16:BK``); a forced family the GPU cannot run is one clear error.

The backward (:func:`choose_backward`, the registry's ``direction`` BACKWARD families, which the forward never
picks): the first backward family of the registry's order that takes the dtype and head dim, runs on the GPU and
fits its shared memory (``fma_bwd`` runs everywhere); rows not aligned for it fall back, launch by launch, to the
next (``KernelChoice.for_alignment``); causal launches take a family's causal configuration first where the
registry gives one (``causal_defaults``; ``KernelChoice.causal_candidates``). 16-bit gradients need compute
capability 8.0 as the 16-bit forward does. ``HILBERT_HPC_BWD_KERNEL`` forces one (``fma_bwd`` or
``fma_bwd:BK,BQ``, ``wgmma16_bwd:NWG,PIPE,STAGES,DQ,LOAD,DKV,BQ``), for every dtype, causal or not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import hilbert_hpc.kernels.program as program
import hilbert_hpc.kernels.registry as registry
from hilbert_hpc.kernels.registry import BACKWARD, FLOAT32, FORWARD, KernelFamily, Variant

FP32_ENV = "HILBERT_HPC_FP32_KERNEL"
SIXTEEN_BIT_ENV = "HILBERT_HPC_HALF_KERNEL"
BACKWARD_ENV = "HILBERT_HPC_BWD_KERNEL"
#: oldest compute capability with 16-bit tensor cores (bf16/fp16 mma.sync m16n8k16)
SIXTEEN_BIT_MIN_CC = 80
#: the 16-bit families on compute capability 9.0, preferred first (the first with the head dim runs)
HOPPER_16 = ("tma16", "wgmma16")
#: the 16-bit family elsewhere (compute capability 8.0 and newer)
OTHER_16 = "mma16"
#: Hopper's compute capability
HOPPER_CC = 90
#: opt-in shared memory per block of known compute capabilities, for choices made without the GPU (``plan``)
SHARED_OPTIN = {60: 48 << 10, 70: 96 << 10, 75: 64 << 10, 80: 163 << 10, 86: 99 << 10, 87: 163 << 10,
                89: 99 << 10, 90: 227 << 10, 100: 227 << 10, 120: 99 << 10}


@dataclass(frozen=True)
class KernelChoice:
    """The kernel of one (dtype, head dim) on a GPU of compute capability ``cc``, and what comes with it."""

    dtype: str
    head_dim: int
    cc: int
    #: what runs where rows are aligned as the family needs
    variant: Variant
    #: the override that forced it ('' when none did)
    forced: str = ""
    #: FP32 and backward: the variants that may run, in order, for rows of other alignments (``for_alignment``)
    candidates: tuple[Variant, ...] = ()
    #: backward: the candidates of causal launches, each family's causal default first (empty: ``candidates``)
    causal_candidates: tuple[Variant, ...] = ()

    @property
    def name(self) -> str:
        """The family name recorded in results files (``kernel`` attribute): 'tma16', 'wgmma', ..."""
        return self.variant.variant

    @property
    def direction(self) -> str:
        """FORWARD or BACKWARD: what the chosen family computes."""
        return registry.family(self.name).direction

    @property
    def sixteen_bit(self) -> bool:
        """Whether the inputs are 16-bit (the 16-bit provider runs it)."""
        return self.dtype != FLOAT32

    def for_alignment(self, align: int, causal: bool = False) -> Variant:
        """The variant that runs on rows and offsets that are multiples of ``align`` elements (``causal``: in a
        causal launch)."""
        for v in (causal and self.causal_candidates) or self.candidates or (self.variant,):
            if align % v.align == 0:
                return v
        if self.forced:
            raise RuntimeError(f"{_env(self.dtype, self.direction)}={self.forced}: rows are not aligned to {self.variant.align} "
                               f"elements")
        raise RuntimeError(f"no {self.dtype} {self.direction} kernel reads rows aligned to {align} elements")

    def accumulating(self) -> Variant:
        """The instantiation of the chosen configuration that merges into a float32 running output (tma16)."""
        if not registry.family(self.name).float32_output:
            raise ValueError(f"a float32 running output needs tma16, not {self.name}")
        return registry.family(self.name).variant(self.head_dim, self.dtype, self.variant.config, accumulate=True)

    def scratch_heads(self, heads: int) -> int:
        """Heads of one group of the float32 running output of local patterns (tma16), 0 where none is kept:
        half of them (at least one), so the scratch is at most 1/4 of the 16-bit Q/K/V/O bytes from 2 heads on.
        Smaller groups cost launches (measured on an H200, the causal bf16 anchor: 5.55 ms rounded per launch;
        6.18 / 6.46 / 6.80 / 6.95 ms in groups of 12 / 6 / 4 / 3 heads)."""
        return max(1, heads // 2) if registry.family(self.name).float32_output else 0

    def scratch_bytes(self, rows: int, heads: int) -> int:
        """Device memory the kernel allocates besides its arrays for ``rows`` rows of ``heads`` heads: tma16's
        float32 running output of one head group (``plan`` counts it)."""
        return rows * self.scratch_heads(heads) * self.head_dim * 4


def _env(dtype: str, direction: str = FORWARD) -> str:
    if direction == BACKWARD:
        return BACKWARD_ENV
    return FP32_ENV if dtype == FLOAT32 else SIXTEEN_BIT_ENV


def forced_family(dtype: str, forced: str, direction: str = FORWARD) -> tuple[KernelFamily, tuple | None]:
    """(family, configuration or None for its default) of an override value such as 'tma16:64,4,3,1,1,1,1', among
    the ``direction`` families of ``dtype``."""
    env = _env(dtype, direction)
    families = registry.families_for(dtype, direction)
    head, _, rest = forced.strip().partition(":")
    known = {f.name: f for f in families}
    if head not in known:
        spelled = ", ".join(f"{f.name} or {f.name}:{','.join(f.config_fields)}" if f.config_fields else f.name
                            for f in families)
        kind = ("FP32" if dtype == FLOAT32 else "16-bit") + (" backward" if direction == BACKWARD else "")
        raise RuntimeError(f"{env}={forced}: unknown {kind} kernel variant {head!r}; use {spelled}")
    fam = known[head]
    if not rest:
        return fam, None
    try:
        cfg = tuple(int(x) for x in rest.split(","))
    except ValueError:
        raise RuntimeError(f"{env}={forced}: expected integers after {head}:") from None
    if len(cfg) != len(fam.config_fields):
        raise RuntimeError(f"{env}={forced}: {head} takes {','.join(fam.config_fields) or 'no configuration'}")
    return fam, cfg


def choose(dtype: Any, head_dim: int, cc: int | None = None, override: str | None = None,
           shared_limit: int | None = None) -> KernelChoice:
    """THE decision of which kernel runs for ``dtype`` and ``head_dim`` on a GPU of compute capability ``cc``
    (major * 10 + minor; None: the current GPU's, asked once here).

    ``override``: a forced family (``[name][:config]``); None reads ``HILBERT_HPC_FP32_KERNEL`` (float32) or
    ``HILBERT_HPC_HALF_KERNEL`` (16 bits), '' forces nothing. ``shared_limit``: the opt-in shared memory per
    block (None: the current GPU's, or ``SHARED_OPTIN``'s for a given ``cc``). A RuntimeError says why nothing
    can run (a ValueError: an unsupported head dim or dtype)."""
    name = registry.dtype_name(dtype)
    registry.check_head_dim(name, head_dim)
    cc, shared_limit = _device(cc, shared_limit)
    forced = (os.environ.get(_env(name), "") if override is None else override).strip()
    if name == FLOAT32:
        return _choose_fp32(head_dim, cc, forced, shared_limit)
    return _choose_16(name, head_dim, cc, forced, shared_limit)


def choose_backward(dtype: Any, head_dim: int, cc: int | None = None, override: str | None = None,
                    shared_limit: int | None = None) -> KernelChoice:
    """THE decision of which backward kernel runs for ``dtype`` and ``head_dim`` on a GPU of compute capability
    ``cc`` (None: the current GPU's): the first of the registry's backward families (preferred first) that
    takes them, runs on the GPU and fits its shared memory (its first configuration that does); the others that do are the choice's fallbacks for
    rows it cannot read (``for_alignment``). Causal launches take each family's causal default first where it has
    one (``causal_candidates``). ``override``: a forced family (``[name][:config]``, causal or not); None reads
    ``HILBERT_HPC_BWD_KERNEL``, '' forces nothing. A RuntimeError says why nothing can run (a ValueError: an
    unsupported dtype, or a head dim of a forced family)."""
    name = registry.dtype_name(dtype)
    cc, shared_limit = _device(cc, shared_limit)
    if name != FLOAT32:
        _check_sixteen_bit(name, cc)
    forced = (os.environ.get(BACKWARD_ENV, "") if override is None else override).strip()
    if forced:
        fam, cfg = forced_family(name, forced, BACKWARD)
        chosen = _checked_forced(BACKWARD_ENV, forced, fam, fam.variant(head_dim, name, cfg), cc, shared_limit)
        return KernelChoice(name, head_dim, cc, chosen, forced, (chosen,))
    fits, causal_fits = (tuple(v for f in registry.families_for(name, BACKWARD) if head_dim in f.head_dims
                               for v in [_first_fitting(f, head_dim, name, cc, shared_limit, causal)]
                               if v is not None) for causal in (False, True))
    if not fits:
        dims = sorted({d for f in registry.families_for(name, BACKWARD) for d in f.head_dims})
        raise RuntimeError(f"no {name} backward kernel runs head_dim {head_dim} on compute capability "
                           f"{cc / 10:.1f} (head dims {dims})")
    return KernelChoice(name, head_dim, cc, fits[0], "", fits, causal_fits if causal_fits != fits else ())


def _first_fitting(fam: KernelFamily, head_dim: int, dtype: str, cc: int, shared_limit: int,
                   causal: bool = False) -> Variant | None:
    """The first configuration of ``fam`` for ``head_dim`` (default, or for ``causal`` launches the causal
    default, then alternatives) that the GPU runs and whose block fits its shared memory; None if none does."""
    for cfg in fam.configurations(head_dim, causal):
        v = fam.variant(head_dim, dtype, cfg)
        if v.runs_on(cc) and v.shared_bytes <= _limit(fam, shared_limit):
            return v
    return None


def _device(cc: int | None, shared_limit: int | None) -> tuple[int, int]:
    """(compute capability, opt-in shared memory per block): the current GPU's where ``cc`` is None, else
    ``SHARED_OPTIN``'s for ``cc`` unless ``shared_limit`` is given."""
    if cc is None:
        return program.compute_capability(), program.shared_limit() if shared_limit is None else shared_limit
    if shared_limit is None:
        shared_limit = SHARED_OPTIN[max([c for c in SHARED_OPTIN if c <= cc] or [min(SHARED_OPTIN)])]
    return cc, shared_limit


def _limit(fam: KernelFamily, shared_limit: int) -> int:
    return fam.max_shared or shared_limit


def _checked_forced(env: str, forced: str, fam: KernelFamily, chosen: Variant, cc: int, shared_limit: int) -> Variant:
    """``chosen``, the variant an override forced, where the GPU runs it; one clear RuntimeError otherwise."""
    if chosen.min_cc > cc:
        raise RuntimeError(f"{env}={forced}: needs compute capability {chosen.min_cc / 10:.1f} or newer, "
                           f"this GPU has {cc / 10:.1f}")
    if cc > chosen.max_cc:
        raise RuntimeError(f"{env}={forced}: code for {chosen.arch} runs on compute capability "
                           f"{chosen.max_cc / 10:.1f} only, this GPU has {cc / 10:.1f}")
    if chosen.shared_bytes > _limit(fam, shared_limit):
        raise RuntimeError(f"{env}={forced}: needs {chosen.shared_bytes} bytes of shared memory per "
                           f"block for head_dim {chosen.head_dim}, this GPU allows {_limit(fam, shared_limit)}")
    return chosen


@lru_cache(maxsize=256)        # a pure function of its arguments, asked at every call of the forward
def _choose_fp32(head_dim: int, cc: int, forced: str, shared_limit: int) -> KernelChoice:
    if forced:
        fam, cfg = forced_family(FLOAT32, forced)
        chosen = _checked_forced(FP32_ENV, forced, fam, fam.variant(head_dim, FLOAT32, cfg), cc, shared_limit)
        return KernelChoice(FLOAT32, head_dim, cc, chosen, forced, (chosen,))
    fits = tuple(v for f in registry.families_for(FLOAT32) for v in [f.variant(head_dim)]
                 if v.shared_bytes <= _limit(f, shared_limit) and v.runs_on(cc))
    if not fits:
        raise RuntimeError("no FP32 kernel variant fits this GPU")  # pragma: no cover - warp always fits
    return KernelChoice(FLOAT32, head_dim, cc, fits[0], "", fits)


def _check_sixteen_bit(dtype: str, cc: int) -> None:
    """16-bit inputs need 16-bit tensor cores (the forward's; the backward's gradients go with it)."""
    if cc < SIXTEEN_BIT_MIN_CC:
        raise RuntimeError(f"dtype {dtype} needs 16-bit tensor cores (compute capability 8.0 or newer); "
                           f"this GPU has {cc / 10:.1f}")


@lru_cache(maxsize=256)        # as _choose_fp32
def _choose_16(dtype: str, head_dim: int, cc: int, forced: str, shared_limit: int) -> KernelChoice:
    _check_sixteen_bit(dtype, cc)
    if forced:
        fam, cfg = forced_family(dtype, forced)
        if not fam.min_cc <= cc <= fam.max_cc:
            raise RuntimeError(f"{SIXTEEN_BIT_ENV}={forced}: {fam.name} runs on compute capability "
                               f"{fam.max_cc / 10:.1f} only; this GPU has {cc / 10:.1f}")
        if head_dim not in fam.head_dims:
            raise RuntimeError(f"{SIXTEEN_BIT_ENV}={forced}: {fam.name} supports head_dim in "
                               f"{list(fam.head_dims)}, not {head_dim}")
    else:
        names = [n for n in HOPPER_16 if head_dim in registry.family(n).head_dims] if cc == HOPPER_CC else [OTHER_16]
        fam, cfg = registry.family(names[0]), None
    chosen = fam.variant(head_dim, dtype, cfg)
    limit = _limit(fam, shared_limit)
    if chosen.shared_bytes > limit:
        raise RuntimeError(f"{chosen.name} needs {chosen.shared_bytes} bytes of shared memory per block; "
                           f"this GPU allows {limit}")
    return KernelChoice(dtype, head_dim, cc, chosen, forced)


def planned_choice(dtype: Any, head_dim: int, cc: int | None = None) -> KernelChoice | None:
    """The choice ``run`` will make, for a plan: on a GPU of compute capability ``cc`` when given, else on this
    machine's GPU where one is usable, else on Hopper (compute capability 9.0). None where no kernel can run:
    ``run`` refuses that case with the reason (the backend's ``check_case``)."""
    if cc is None:
        try:
            program.compute_capability()
        except Exception:  # noqa: BLE001 - no CuPy / no GPU here (a login node)
            cc = HOPPER_CC
    try:
        return choose(dtype, head_dim, cc)
    except (RuntimeError, ValueError):
        return None
