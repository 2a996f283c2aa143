"""The backward kernels without a GPU: registry entries, the backward choice, the key chunks, the array checks.

The compile check (tests/test_kernel_sources.py, hilbert_hpc.kernels.check) compiles every backward
instantiation with the registry's others; the float one (and the 16-bit ones) for compute_61 too.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from hilbert_hpc.kernels import registry
from hilbert_hpc.kernels.backward import BackwardKernels, check_arrays, key_chunks
from hilbert_hpc.kernels.check import CHECK_ARCHS, archs_for
from hilbert_hpc.kernels.registry import (BACKWARD, FMA_BWD, FORWARD, HEAD_DIMS, HOPPER_SHARED, MMA16_BWD, TF32X3_BWD,
                                         WGMMA16_BWD)
from hilbert_hpc.kernels.selection import BACKWARD_ENV, choose, choose_backward

from nvrtc_probe import needs_nvrtc

DTYPES = ("float32", "bfloat16", "float16")


def test_backward_families_are_never_forward_choices():
    backward = {f.name for f in registry.FAMILIES.values() if f.direction == BACKWARD}
    assert backward == {"wgmma16_bwd", "mma16_bwd", "tf32x3_bwd", "fma_bwd"}
    for dtype in DTYPES:
        assert not backward & {f.name for f in registry.families_for(dtype)}
        preferred = ["tf32x3_bwd", "fma_bwd"] if dtype == "float32" else ["wgmma16_bwd", "mma16_bwd", "fma_bwd"]
        assert [f.name for f in registry.families_for(dtype, BACKWARD)] == preferred
        for cc in (61, 80, 90):
            for d in HEAD_DIMS:
                try:
                    assert registry.family(choose(dtype, d, cc=cc, override="").name).direction == FORWARD
                except RuntimeError:                       # 16 bits before compute capability 8.0
                    assert dtype != "float32" and cc < 80
    with pytest.raises(RuntimeError, match="unknown FP32 kernel variant 'fma_bwd'"):
        choose("float32", 64, cc=90, override="fma_bwd")


#: tf32x3_bwd's keys per block per compute capability and head dim (absent: it does not fit, fma_bwd runs): 64 at
#: D = 32 (the default), else 128 where it fits; shared memory 74,240 / 123,392 / 172,544 / 221,696 bytes at
#: BK = 128, 46,592 / 79,360 / 112,128 / 144,896 at 64
TF32_BWD_KEYS = {80: {32: 64, 64: 128, 96: 64, 128: 64}, 86: {32: 64, 64: 64},
                 90: {32: 64, 64: 128, 96: 128, 128: 128}, 100: {32: 64, 64: 128, 96: 128, 128: 128}}


@pytest.mark.parametrize("cc", [61, 70, 80, 86, 90, 100])
@pytest.mark.parametrize("dtype", DTYPES)
def test_choose_backward_per_gpu(cc, dtype):
    for d in HEAD_DIMS:
        if dtype != "float32" and cc < 80:
            with pytest.raises(RuntimeError, match=f"dtype {dtype} needs 16-bit tensor cores"):
                choose_backward(dtype, d, cc=cc, override="")
            continue
        c = choose_backward(dtype, d, cc=cc, override="")
        assert c.direction == BACKWARD and c.forced == ""
        if dtype == "float32":
            # split TF32 on 8.0+ with the keys per block of TF32_BWD_KEYS, FMA for the rest and odd rows
            bk = TF32_BWD_KEYS.get(cc, {}).get(d)
            if bk is None:
                assert c.name == "fma_bwd" and c.variant == FMA_BWD.variant(d) and c.for_alignment(1) == c.variant
                continue
            assert c.name == "tf32x3_bwd" and c.variant == TF32X3_BWD.variant(d, dtype, (bk,))
            assert c.for_alignment(4) == c.variant and c.for_alignment(2) == FMA_BWD.variant(d)
            continue
        # 16 bits: wgmma on Hopper (D = 64, 128), else the mma.sync kernel, BK = 64 where BK = 128 does not fit
        # (D = 128 on 8.6); FMA for odd rows
        assert c.for_alignment(8) == c.variant and c.for_alignment(4) == FMA_BWD.variant(d, dtype)
        if cc == 90 and d in WGMMA16_BWD.head_dims:
            assert c.name == "wgmma16_bwd" and c.variant == WGMMA16_BWD.variant(d, dtype)
            continue
        bk = 64 if (d == 128 and cc == 86) else 128
        assert c.name == "mma16_bwd" and c.variant == MMA16_BWD.variant(d, dtype, (bk,))


@needs_nvrtc
@pytest.mark.parametrize("v", WGMMA16_BWD.instantiations(), ids=[v.name for v in WGMMA16_BWD.instantiations()])
def test_wgmma16_bwd_has_no_spills_and_wgmma_not_serialized(v):
    """ptxas for sm_90a (through NVRTC, no GPU): no local memory, wgmma not serialized, within Hopper's shared
    memory; the PTX reads dS MN-major (imm-trans-a) and adds dQ with red.global.add.v2.f32, or with DQ = 1 by
    TMA reduce-add alone; it loads Q and dO by cp.async, or with LOAD = 1 by TMA alone; TMA reduce-adds only with
    DQ = 1 or DKV = 1."""
    from hilbert_hpc.kernels.check import arch_ptxas_report, compile_templates
    from hilbert_hpc.kernels.program import ARCH_OPTIONS

    r = arch_ptxas_report(v)
    assert r["registers"] > 0 and (r["stack"], r["spill_stores"], r["spill_loads"]) == (0, 0, 0), r["log"]
    assert not r["serialized"] and v.shared_bytes <= HOPPER_SHARED, r["log"]
    ptx = compile_templates("compute_90a", v.source, [v.name], ARCH_OPTIONS)[1]
    assert "p, 1, 1, 1, 1;" in ptx
    dq_by_tma, load_by_tma, dkv_by_tma = (bool(x) for x in v.config[3:6])
    assert ("red.relaxed.gpu.global.add.v2.f32" in ptx) != dq_by_tma
    assert ("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group" in ptx) == (dq_by_tma or dkv_by_tma)
    assert ("cp.async.bulk.tensor.4d.shared::cluster.global" in ptx) == load_by_tma
    assert v.tensor_maps == (dq_by_tma or load_by_tma or dkv_by_tma)


def test_causal_launches_take_the_causal_default():
    """wgmma16_bwd's causal launches take its causal default (dK and dV by TMA reduce-add, DKV = 1) and the others
    its default; the fallbacks for other alignments are the same families either way; an override forces both."""
    fam = registry.WGMMA16_BWD
    for d in fam.head_dims:
        c = choose_backward("bfloat16", d, cc=90, override="")
        assert c.for_alignment(8) == c.variant == fam.variant(d, "bfloat16")
        assert c.for_alignment(8, causal=True) == fam.variant(d, "bfloat16", fam.causal_defaults[d])
        assert c.for_alignment(8, causal=True).config[5] == 1 and c.variant.config[5] == 0
        assert c.for_alignment(4, causal=True) == c.for_alignment(4) == FMA_BWD.variant(d, "bfloat16")
        assert fam.configurations(d, causal=True)[0] == fam.causal_defaults[d]
        assert set(fam.configurations(d, causal=True)) == set(fam.configurations(d))
        forced = choose_backward("bfloat16", d, cc=90, override="wgmma16_bwd:2,2,3,0,1,0,64")
        assert forced.for_alignment(8, causal=True) == forced.for_alignment(8) == forced.variant
    assert choose_backward("bfloat16", 64, cc=80, override="").causal_candidates == ()   # mma16_bwd has none


def test_backward_override(monkeypatch):
    monkeypatch.setenv(BACKWARD_ENV, "fma_bwd:64,16")
    c = choose_backward("bfloat16", 32, cc=90)
    assert c.variant.name == "dilated_bwd_fma<bf16_t,32,64,16>" and c.forced == "fma_bwd:64,16"
    assert choose_backward("float32", 32, cc=90, override="").variant.config == TF32X3_BWD.defaults[32]
    assert choose_backward("float32", 64, cc=90, override="tf32x3_bwd:64").variant.name == "dilated_bwd_tf32x3<64,64>"
    with pytest.raises(RuntimeError, match="HILBERT_HPC_BWD_KERNEL=tf32x3_bwd: needs compute capability 8.0"):
        choose_backward("float32", 64, cc=70, override="tf32x3_bwd")
    assert choose_backward("bfloat16", 64, cc=90, override="mma16_bwd:64").variant.name == \
        "dilated_bwd_mma_16<bf16_t,64,64>"
    assert choose_backward("float16", 128, cc=90, override="wgmma16_bwd:2,1,3,0,0,0,64").variant.name == \
        "dilated_bwd_wgmma_16<f16_t,128,2,1,3,0,0,0,64>"
    assert choose_backward("bfloat16", 64, cc=90, override="wgmma16_bwd:2,1,3,0,1,0,64").variant.threads == 384
    assert choose_backward("bfloat16", 128, cc=90, override="").variant.name == "dilated_bwd_wgmma_16<bf16_t,128,2,2,3,1,1,0,64>"
    with pytest.raises(ValueError, match=r"wgmma16_bwd configuration \(NWG, PIPE, STAGES, DQ, LOAD, DKV, BQ\)"):
        choose_backward("bfloat16", 64, cc=90, override="wgmma16_bwd:2,2,0,0,0,0,64")   # a producer and stages
    with pytest.raises(ValueError, match=r"\(NWG, PIPE, STAGES, DQ, LOAD, DKV, BQ\) = \(2, 0, 3, 0, 0, 0, 64\) is not supported"):
        choose_backward("bfloat16", 64, cc=90, override="wgmma16_bwd:2,0,3,0,0,0,64")   # dQ overlaps the next tile
    with pytest.raises(ValueError, match=r"= \(1, 1, 3, 0, 0, 0, 64\) is not supported"):
        choose_backward("bfloat16", 64, cc=90, override="wgmma16_bwd:1,1,3,0,0,0,64")   # two computing warpgroups
    with pytest.raises(ValueError, match=r"\(2, 2, 3, 1, 0, 0, 128\) is not supported"):
        choose_backward("bfloat16", 64, cc=90, override="wgmma16_bwd:2,2,3,1,0,0,128")   # 128-query tiles load by TMA
    assert choose_backward("bfloat16", 64, cc=90, override="wgmma16_bwd:2,2,2,1,1,0,128").variant.name == \
        "dilated_bwd_wgmma_16<bf16_t,64,2,2,2,1,1,0,128>"
    with pytest.raises(RuntimeError, match="HILBERT_HPC_BWD_KERNEL=wgmma16_bwd: needs compute capability 9.0"):
        choose_backward("bfloat16", 64, cc=80, override="wgmma16_bwd")
    with pytest.raises(ValueError, match=r"\(NWG, PIPE, STAGES, DQ, LOAD, DKV, BQ\) = \(2, 1, 3, 1, 0, 0, 64\) is not supported"):
        choose_backward("float16", 96, cc=90, override="wgmma16_bwd:2,1,3,1,0,0,64")   # the dQ tile needs PIPE = 2
    with pytest.raises(ValueError, match=r"wgmma16_bwd supports head_dim in \[32, 64, 96, 128\], got 48"):
        choose_backward("bfloat16", 48, cc=90, override="wgmma16_bwd")
    assert choose_backward("bfloat16", 32, cc=90, override="").variant.name == "dilated_bwd_wgmma_16<bf16_t,32,2,2,3,1,1,0,64>"
    assert choose_backward("bfloat16", 32, cc=80, override="").variant.name == "dilated_bwd_mma_16<bf16_t,32,128>"
    with pytest.raises(RuntimeError, match="HILBERT_HPC_BWD_KERNEL=tma16: unknown 16-bit backward kernel variant"):
        choose_backward("float16", 64, cc=90, override="tma16")
    with pytest.raises(RuntimeError, match="HILBERT_HPC_BWD_KERNEL=fma_bwd:64: fma_bwd takes BK,BQ"):
        choose_backward("float32", 64, cc=90, override="fma_bwd:64")
    with pytest.raises(ValueError, match=r"fma_bwd configuration \(BK, BQ\)"):
        choose_backward("float32", 64, cc=90, override="fma_bwd:48,8")
    with pytest.raises(RuntimeError, match="HILBERT_HPC_BWD_KERNEL=fma_bwd:128,32: needs .* bytes of shared"):
        choose_backward("float32", 128, cc=61, override="fma_bwd:128,32")
    with pytest.raises(ValueError, match="head_dim"):
        choose_backward("float32", 48, cc=90, override="fma_bwd")
    with pytest.raises(RuntimeError, match="no float32 backward kernel runs head_dim 48"):
        choose_backward("float32", 48, cc=90, override="")


def test_fma_bwd_defaults_fit_pascal_and_compile_for_compute_61():
    assert all(FMA_BWD.variant(d).shared_bytes <= 48 * 1024 for d in HEAD_DIMS)
    assert all(FMA_BWD.variant(d, "float16").align == 1 for d in HEAD_DIMS)
    assert archs_for(FMA_BWD.source) == CHECK_ARCHS
    names = {v.name for v in registry.instantiations() if v.source == FMA_BWD.source}
    assert names == {f"dilated_bwd_fma<{t},{d},{c[0]},{c[1]}>" for t in ("float", "bf16_t", "f16_t")
                     for d in HEAD_DIMS for c in FMA_BWD.configurations(d)}


@needs_nvrtc
def test_fma_bwd_has_no_spills_on_pascal_and_hopper():
    """ptxas for sm_61 and sm_90 (through NVRTC, no GPU): no local memory in any instantiation; float atomics."""
    import re

    from hilbert_hpc.kernels.program import DEVICE_OPTIONS, Program, build

    names = tuple(v.name for v in FMA_BWD.instantiations())
    for arch in ("sm_61", "sm_90"):
        built = build(Program(FMA_BWD.source, names, (*DEVICE_OPTIONS, "--ptxas-options=-v")), arch)
        spills = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", built.log)
        assert len(spills) == len(names) and all(s == ("0", "0", "0") for s in spills), built.log
    ptx = build(Program(FMA_BWD.source, names[:1]), "compute_61", "ptx").binary.decode()
    assert "red.global.add.f32" in ptx or "atom.global.add.f32" in ptx


def test_tf32x3_bwd_shared_memory_and_targets():
    """The registry's shared-memory formula is the one at the top of the kernel source; CI compiles it for
    compute_80 and newer (mma.sync TF32, cp.async)."""
    assert [TF32X3_BWD.variant(d, "float32", (bk,)).shared_bytes for bk in (64, 128) for d in HEAD_DIMS] == \
        [46592, 79360, 112128, 144896, 74240, 123392, 172544, 221696]
    assert all(v.align == 4 and v.threads == 2 * v.config[0] and v.min_cc == 80 for v in TF32X3_BWD.instantiations())
    assert archs_for(TF32X3_BWD.source) == tuple(a for a in CHECK_ARCHS if int(a.split("_")[1]) >= 80)


@needs_nvrtc
def test_tf32x3_bwd_spills_on_hopper_at_most_a_few_loop_carried_values():
    """ptxas for sm_90 (through NVRTC, no GPU), the default of each head dim: no local memory at D = 32 and 128
    (dK, dV of D = 128 hold 128 registers); at D = 64 and 96, where the one-instruction TF32 rounding lets ptxas
    schedule the products more densely, a few loop-carried values (at most 352 bytes; those kernels are 1.16-1.18x
    the ones without spills, docs/performance.md)."""
    import re

    from hilbert_hpc.kernels.program import DEVICE_OPTIONS, Program, build

    defaults = {d: TF32X3_BWD.variant(d, "float32").name for d in HEAD_DIMS}
    built = build(Program(TF32X3_BWD.source, tuple(defaults.values()), (*DEVICE_OPTIONS, "--ptxas-options=-v")),
                  "sm_90")
    found = re.findall(r"Function properties for (\S+)\s+ptxas\s+\.\s+\d+ bytes stack frame, (\d+) bytes spill stores",
                       built.log)
    spills = {name: int(stores) for name, stores in found}
    assert len(spills) == len(defaults), built.log
    for d, name in defaults.items():
        stores = spills[built.lowered[name]]
        assert stores == 0 if d in (32, 128) else stores <= 352, (d, stores, built.log)


def pairs(mq: int, mk: int, shift: int | None) -> set:
    return {(i, j) for i in range(mq) for j in range(mk) if shift is None or j <= i + shift}


@pytest.mark.parametrize("shift", [None, 0, 5, -7])
@pytest.mark.parametrize("mk,block,max_blocks", [(100, 8, 3), (96, 32, 1), (5, 64, 2), (64, 32, 2)])
def test_key_chunks_cover_every_visible_pair_once(mk, block, max_blocks, shift):
    kg, vg = (10, 1000, 64, 256), (20, 1000, 64, 512)
    chunks = key_chunks(kg, vg, mk, shift, block, max_blocks)
    assert all(-(-m // block) <= max_blocks and m > 0 for _, _, m, _ in chunks)
    seen = []
    for kc, vc, m, s in chunks:
        c = (kc[0] - kg[0]) // kg[3]
        assert kc == (kg[0] + c * kg[3], *kg[1:]) and vc == (vg[0] + c * vg[3], *vg[1:])
        seen += [(i, c + j) for i, j in pairs(40, m, s)]
    assert len(seen) == len(set(seen)) and set(seen) == pairs(40, mk, shift)
    assert key_chunks(kg, vg, mk, shift, block) == [(kg, vg, mk, shift)]


class Array:
    """An array's metadata as the checks read it (no GPU)."""

    def __init__(self, shape, dtype="float32", itemsize=4, contiguous=True):
        self.shape, self.dtype = tuple(shape), dtype
        self.flags = type("Flags", (), {"c_contiguous": contiguous})()
        self.dtype = type("Dtype", (), {"itemsize": itemsize, "__str__": lambda s: dtype})()


def arrays(n=64, h=2, d=32, sixteen=False, **changed):
    x = dict(q=Array((n, h, d)), k=Array((n, h, d)), v=Array((n, h, d)), dout=Array((n, h, d)),
             lse=Array((n, h)), delta=Array((n, h)), dq=Array((n, h, d)), dk=Array((n, h, d)), dv=Array((n, h, d)))
    if sixteen:
        x.update({k: Array((n, h, d), "bfloat16", 2) for k in ("q", "k", "v", "dout")})
    return x | changed


def test_array_checks_name_the_argument():
    fp32, bf16 = (choose_backward(t, 32, cc=90, override="") for t in ("float32", "bfloat16"))
    check_arrays(fp32, **arrays())
    check_arrays(bf16, **arrays(sixteen=True))
    check_arrays(bf16, (64, 2, 32), **{k: 4096 for k in arrays()})          # raw pointers
    with pytest.raises(ValueError, match="needs q C-contiguous float32, got bfloat16"):
        check_arrays(fp32, **arrays(sixteen=True))
    with pytest.raises(ValueError, match=r"needs dq C-contiguous float32, got float16"):
        check_arrays(bf16, **arrays(sixteen=True, dq=Array((64, 2, 32), "float16", 2)))
    with pytest.raises(ValueError, match="needs k C-contiguous bfloat16 .2-byte items., got float32"):
        check_arrays(bf16, **arrays(sixteen=True, k=Array((64, 2, 32))))
    with pytest.raises(ValueError, match="needs v C-contiguous float32, got float32, not contiguous"):
        check_arrays(fp32, **arrays(v=Array((64, 2, 32), contiguous=False)))
    with pytest.raises(ValueError, match=r"dk must have the shape of k \(64, 2, 32\), got \(64, 2, 16\)"):
        check_arrays(fp32, **arrays(dk=Array((64, 2, 16))))
    with pytest.raises(ValueError, match=r"delta must have shape \(64, 2\) \(n, H\), got \(64,\)"):
        check_arrays(fp32, **arrays(delta=Array((64,))))


def test_the_provider_takes_backward_choices_only():
    with pytest.raises(ValueError, match="runs backward choices"):
        BackwardKernels(choose("float32", 64, cc=90, override=""))
    kernels = BackwardKernels(choose_backward("float32", 64, cc=90, override=""))
    with pytest.raises(ValueError, match="give shape"):
        kernels.local_patterns(*range(9), [(64, 1)], False, 0.125)
    kernels.launch(*range(9), qg=(0, 0, 0, 1), kg=(0, 0, 0, 1), vg=(0, 0, 0, 1), lg=(0, 0, 0, 1), segments=0,
                   heads=1, mq=4, mk=4, shift=None, scale=0.1, head_dim=64)           # nothing to launch
    with pytest.raises(ValueError, match="chosen for head_dim 64, got 32"):
        kernels.launch(*range(9), qg=(0, 0, 0, 1), kg=(0, 0, 0, 1), vg=(0, 0, 0, 1), lg=(0, 0, 0, 1), segments=1,
                       heads=1, mq=4, mk=4, shift=None, scale=0.1, head_dim=32)


def test_launches_of_one_call_follow_each_other(monkeypatch):
    """Within one call every launch after the first is marked as following it (programmatic dependent launch on
    compute capability 9.0+), key chunks included; an empty geometry launches nothing and marks nothing; the
    first launch of each call follows nothing (what came before it on the stream is not ours)."""
    import hilbert_hpc.kernels.backward as backward

    calls, maps = [], []
    monkeypatch.setattr(backward, "compiled", lambda v: lambda grid, block, args, shared_mem, follows: calls.append(
        (grid, follows, args[-3])))
    monkeypatch.setattr(backward, "tensor_maps", lambda *a: maps.append(a) or 4096)
    choice = choose_backward("bfloat16", 64, cc=90, override="")
    assert choice.variant.dependent_launch and choice.variant.maps_argument and choice.variant.tensor_maps
    kernels = BackwardKernels(choice, max_key_blocks=2, max_blocks=132)
    kernels.local_patterns(*range(9), [(512, 1), (1024, 2), (1024, 4)], False, 0.125, shape=(1024, 4, 64))
    assert [f for _, f, _ in calls] == [False] + [True] * (len(calls) - 1) and len(calls) > 3
    assert all(int(last) == 4096 for *_, last in calls)            # the launch's tensor maps
    assert maps and all(tuple(int(x) for x in a[0]) == tuple(range(9)) for a in maps)   # of the launch's arrays
    assert len({a[2] for a in maps}) > 1                           # each key chunk's own dk map
    atomic = choose_backward("bfloat16", 64, cc=90, override="wgmma16_bwd:2,2,3,0,0,0,64")
    calls.clear()
    BackwardKernels(atomic).local_patterns(*range(9), [(512, 1)], False, 0.125, shape=(1024, 4, 64))
    assert calls and all(int(last) == 0 for *_, last in calls)     # no map read: a null pointer
    assert any(grid[1] < 1024 // choice.variant.block_queries for grid, _, _ in calls)   # chunked
    calls.clear()
    geometry = dict(qg=(0, 0, 0, 1), kg=(0, 0, 0, 1), vg=(0, 0, 0, 1), lg=(0, 0, 0, 1), heads=1, mq=64, mk=64,
                    shift=None, scale=0.1, head_dim=64)
    assert not kernels.launch(*range(9), **geometry, segments=0)
    assert kernels.launch(*range(9), **geometry, segments=1) and calls[-1][1] is False
    assert kernels.launch(*range(9), **geometry, segments=1, follows=True) and calls[-1][1] is True
    assert {f.name for f in registry.FAMILIES.values() if f.dependent_launch} == {"wgmma16_bwd", "mma16_bwd",
                                                                                  "tf32x3_bwd"}


def test_tensor_maps_are_made_once_per_launch(monkeypatch):
    """backward.tensor_maps builds a launch's five maps on its first call and hands out the same device array's
    address for the same numbers again (NumPy scalars or ints alike); another pointer or row count is another
    launch, whose maps address its own arrays."""
    import types

    import hilbert_hpc.kernels.backward as backward
    from hilbert_hpc.kernels import tma

    made = []

    def device_maps(device, geometries):
        made.append(geometries)
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=4096 * len(made)))

    monkeypatch.setattr(tma, "device_maps", device_maps)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))))
    backward._tensor_maps.cache_clear()
    pointers = tuple(np.uint64(1 << 30) * (i + 1) for i in range(9))
    geo = ((0, 8192, 64, 256), (0, 8192, 64, 256), (0, 8192, 64, 256))
    first = backward.tensor_maps(pointers, *geo, 2048, 2048, 4, 32, 64)
    assert backward.tensor_maps(tuple(int(p) for p in pointers), *geo, 2048, 2048, 4, 32, 64) == first == 4096
    assert len(made) == 1 and [g.address for g in made[0]] == [int(pointers[i]) for i in (6, 0, 3, 7, 8)]
    assert backward.tensor_maps(pointers, *geo, 2048, 1024, 4, 32, 64) == 8192 and len(made) == 2
    backward._tensor_maps.cache_clear()


def test_dependent_launch_arguments_and_structures():
    """The driver's CUlaunchAttribute (72 bytes) and CUlaunchConfig (56, stream at 32) as ctypes lays them out,
    and the kernel arguments packed from the NumPy scalars the launchers pass, each at its address."""
    import ctypes

    from hilbert_hpc.kernels import dependent_launch as dl

    assert ctypes.sizeof(dl._Attribute) == 72 and ctypes.sizeof(dl._Config) == 56 and dl._Config.stream.offset == 32
    args = (np.uint64(2**63), np.int64(-5), np.int32(7), np.float32(0.5), np.uint32(9), np.int32(-1))
    buffer, params = dl.packed_arguments(args)
    assert [ctypes.string_at(params[i], a.nbytes) for i, a in enumerate(args)] == [a.tobytes() for a in args]
    assert ctypes.sizeof(buffer) == sum(a.nbytes for a in args) and len(params) == len(args)
    with pytest.raises(TypeError, match="float64 is not supported"):
        dl.packed_arguments((np.float64(1.0),))


@needs_nvrtc
def test_row_dot_kernels_compile_for_every_gpu():
    """rowsum(dO * O) (row_dot.cu): every dtype, vector and scalar loads, for Pascal (compute_61) and Hopper."""
    from hilbert_hpc.kernels import program
    from hilbert_hpc.kernels.backward import ROW_DOT_PROGRAM

    assert len(ROW_DOT_PROGRAM.names) == 6
    for target in ("compute_61", "compute_90"):
        built = program.build(ROW_DOT_PROGRAM, target, "ptx")
        assert set(built.lowered) == set(ROW_DOT_PROGRAM.names)


def test_fresh_gradients_are_stored_by_a_first_pattern_that_covers_every_row(monkeypatch):
    """fresh_kv: the launches of a first pattern whose keys are every row (dilation 1, segments tiling the rows)
    are fresh (the kernel's last argument 1: dK and dV stored, not added), every other launch adds (0) and
    nothing is zeroed; where the first pattern does not cover every row, or the kernel has no fresh launch,
    dk and dv are zeroed first and no launch is fresh; without fresh_kv nothing changes."""
    import hilbert_hpc.kernels.backward as backward

    calls, zeroed = [], []
    monkeypatch.setattr(backward, "compiled", lambda v: lambda grid, block, args, shared_mem, follows: calls.append(
        (v.fresh_gradients, int(args[-2]) if v.fresh_gradients else None, int(args[7]), int(args[8]))))
    monkeypatch.setattr(backward, "tensor_maps", lambda *a: 4096)
    monkeypatch.setattr(backward, "zero_float32", lambda x, count: zeroed.append((int(x), count)))
    shape, arrays = (1024, 4, 64), range(9)
    choice = choose_backward("bfloat16", 64, cc=90, override="")
    kernels = BackwardKernels(choice, max_key_blocks=2, max_blocks=132)
    for causal in (False, True):
        calls.clear()
        kernels.local_patterns(*arrays, [(512, 1), (1024, 2), (1024, 4)], causal, 0.125, shape=shape, fresh_kv=True)
        first = len(backward.local_launches([(512, 1)], causal, 0.125, *shape))
        chunks = 512 // choice.variant.block_queries // 2          # key chunks of the first pattern's launch
        assert first == 1 and [f for _, f, _, _ in calls[:chunks]] == [1] * chunks
        assert [f for _, f, _, _ in calls[chunks:]] == [0] * (len(calls) - chunks) and len(calls) > chunks
        assert not zeroed
    for patterns in ([(1024, 2), (512, 1)], [(768, 1)], [(2048, 1)]):   # first not dilation 1 / not tiling
        calls.clear()
        kernels.local_patterns(*arrays, patterns, False, 0.125, shape=shape, fresh_kv=True)
        assert zeroed == [(7, 1024 * 4 * 64), (8, 1024 * 4 * 64)] and all(f == 0 for _, f, _, _ in calls)
        zeroed.clear()
    calls.clear()
    kernels.local_patterns(*arrays, [(512, 1)], False, 0.125, shape=shape)
    assert not zeroed and calls and all(f == 0 for _, f, _, _ in calls)
    atomic_mma = BackwardKernels(choose_backward("bfloat16", 64, cc=80, override=""))
    assert not atomic_mma.choice.variant.fresh_gradients
    calls.clear()
    atomic_mma.local_patterns(*arrays, [(512, 1)], False, 0.125, shape=shape, fresh_kv=True)
    assert zeroed == [(7, 1024 * 4 * 64), (8, 1024 * 4 * 64)] and calls and all(f is None for _, f, _, _ in calls)
    with pytest.raises(ValueError, match="no fresh launch"):
        atomic_mma.launch(*arrays, qg=(0, 0, 64, 256), kg=(0, 0, 64, 256), vg=(0, 0, 64, 256), lg=(0, 0, 1, 4),
                          segments=1, heads=1, mq=64, mk=64, shift=None, scale=0.1, head_dim=64, fresh=True)
    assert {f.name for f in registry.FAMILIES.values() if f.fresh_gradients} == {"wgmma16_bwd"}


def test_persistent_configurations_run_a_grid_of_one_block_per_sm(monkeypatch):
    """A persistent wgmma16_bwd configuration (LOAD = DQ = 1, PIPE = 2, DKV = 0, BQ = 64, D <= 64) with more work
    items (problems x key blocks) than blocks gets a grid of max_blocks blocks and the items' count as its last
    argument; with fewer items, or with HILBERT_HPC_BWD_PERSISTENT=0, or for another configuration, the grid is
    problems x key blocks and the count 0 (a block an item)."""
    import hilbert_hpc.kernels.backward as backward

    calls = []
    monkeypatch.setattr(backward, "compiled", lambda v: lambda grid, block, args, shared_mem, follows: calls.append(
        (v.persistent, tuple(grid), int(args[-1]))))
    monkeypatch.setattr(backward, "tensor_maps", lambda *a: 4096)
    fam = registry.WGMMA16_BWD
    assert {d: [c for c in fam.configurations(d) if fam.variant(d, "bfloat16", c).persistent]
            for d in fam.head_dims} == {32: [fam.defaults[32]], 64: [fam.defaults[64]], 96: [], 128: []}
    geometry = dict(qg=(0, 512 * 256, 64, 256), kg=(0, 512 * 256, 64, 256), vg=(0, 512 * 256, 64, 256),
                    lg=(0, 512 * 4, 1, 4), segments=2, heads=4, mq=512, mk=512, shift=None, scale=0.1, head_dim=64)
    items = 2 * 4 * (512 // 128)
    choice = choose_backward("bfloat16", 64, cc=90, override="")
    BackwardKernels(choice, max_blocks=5).launch(*range(9), **geometry)
    assert calls[-1] == (True, (5, 1), items)
    BackwardKernels(choice, max_blocks=items).launch(*range(9), **geometry)
    assert calls[-1] == (True, (8, 4), 0)
    monkeypatch.setenv(backward.PERSISTENT_ENV, "0")
    BackwardKernels(choice, max_blocks=5).launch(*range(9), **geometry)
    assert calls[-1] == (True, (8, 4), 0)
    monkeypatch.delenv(backward.PERSISTENT_ENV)
    causal = choose_backward("bfloat16", 64, cc=90, override="")
    BackwardKernels(causal, max_blocks=5).launch(*range(9), **{**geometry, "shift": 0})
    assert calls[-1] == (False, (8, 4), 0)                    # causal launches take DKV = 1


@needs_nvrtc
def test_host_layout_and_persistence_are_the_kernels():
    """registry.wgmma16_bwd_shared_bytes and wgmma16_bwd_persistent give, for every configuration of every head dim,
    the kernel's own shared-memory layout size and persistence (BwdConfig in dilated_bwd_wgmma_16.cu): static
    asserts compiled by NVRTC, so that a change on one side alone fails here, not on a GPU."""
    from hilbert_hpc.kernels.compile import nvrtc_compile
    from hilbert_hpc.kernels.program import ARCH_OPTIONS, source

    fam = registry.WGMMA16_BWD
    checks = []
    for d in fam.head_dims:
        for cfg in fam.configurations(d):
            v = fam.variant(d, "bfloat16", cfg)
            args = ", ".join(map(str, (d, *cfg)))
            checks.append(f"static_assert(BwdConfig<{args}>::Layout::bytes == {v.shared_bytes}, \"bytes {args}\");")
            checks.append(f"static_assert((BwdConfig<{args}>::LOOP != 0) == {str(v.persistent).lower()}, "
                          f"\"persistent {args}\");")
    assert len(checks) == 2 * sum(len(fam.configurations(d)) for d in fam.head_dims)
    text = source(fam.source) + "\n" + "\n".join(checks) + "\n"
    nvrtc_compile(text, "layout_checks.cu", (), ARCH_OPTIONS, fam.arch, "ptx")     # a mismatch: RuntimeError
    wrong = text + f"static_assert(BwdConfig<64, {', '.join(map(str, fam.defaults[64]))}>::Layout::bytes == 1, \"x\");"
    with pytest.raises(RuntimeError, match="static assertion failed|static_assert"):
        nvrtc_compile(wrong, "layout_checks.cu", (), ARCH_OPTIONS, fam.arch, "ptx")
