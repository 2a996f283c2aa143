"""The kernel registry is the only description of the kernel families, and choose() is the one decision.

Everything the compile check compiles comes from the registry; each family's defaults and alternatives fit its
shared memory; choose() gives, for compute capabilities 9.0, 8.0 and 6.1, every dtype and head dim, the kernels
the package ran before the registry existed (the table below).
"""

from __future__ import annotations

import pytest

from hilbert_hpc.kernels import check, registry
from hilbert_hpc.kernels.registry import FAMILIES, HEAD_DIMS
from hilbert_hpc.kernels.selection import SHARED_OPTIN, choose

#: (compute capability, dtype) -> the family per head dim 32, 64, 96, 128 (None: refused)
EXPECTED = {
    (90, "float32"): ("wgmma_ws", "wgmma_ws", "wgmma_ws", "wgmma_ws"),
    (90, "bfloat16"): ("tma16", "tma16", "tma16", "tma16"),
    (90, "float16"): ("tma16", "tma16", "tma16", "tma16"),
    (80, "float32"): ("tf32x3", "tf32x3", "tf32x3", "tf32x3"),
    (80, "bfloat16"): ("mma16", "mma16", "mma16", "mma16"),
    (80, "float16"): ("mma16", "mma16", "mma16", "mma16"),
    (61, "float32"): ("tiled64", "tiled64", "warp", "warp"),
    (61, "bfloat16"): (None, None, None, None),
    (61, "float16"): (None, None, None, None),
}


@pytest.mark.parametrize("cc,dtype", sorted(EXPECTED))
def test_choose_gives_the_kernels_of_each_gpu(cc, dtype):
    for d, want in zip(HEAD_DIMS, EXPECTED[(cc, dtype)]):
        if want is None:
            with pytest.raises(RuntimeError, match=f"dtype {dtype} needs 16-bit tensor cores"):
                choose(dtype, d, cc=cc, override="")
            continue
        c = choose(dtype, d, cc=cc, override="")
        assert c.name == want and c.variant == FAMILIES[want].variant(d, dtype)
        assert (c.dtype, c.head_dim, c.cc, c.forced) == (dtype, d, cc, "")


def test_the_fp32_choice_falls_back_to_warp_for_unaligned_rows():
    c = choose("float32", 64, cc=90, override="")
    assert c.for_alignment(4) is c.variant and c.for_alignment(16).variant == "wgmma_ws"
    assert c.for_alignment(2).variant == "warp" and c.for_alignment(1).variant == "warp"
    forced = choose("float32", 64, cc=90, override="tf32x3")
    with pytest.raises(RuntimeError, match="HILBERT_HPC_FP32_KERNEL=tf32x3: rows are not aligned to 4"):
        forced.for_alignment(2)


def test_override_is_read_from_the_environment_once_per_choice(monkeypatch):
    monkeypatch.setenv("HILBERT_HPC_FP32_KERNEL", "warp")
    monkeypatch.setenv("HILBERT_HPC_HALF_KERNEL", "wgmma16:64,1,1")
    assert choose("float32", 64, cc=90).name == "warp"
    c = choose("bfloat16", 64, cc=90)
    assert c.name == "wgmma16" and c.variant.config == (64, 1, 1) and c.forced == "wgmma16:64,1,1"
    assert choose("float32", 64, cc=90, override="").name == "wgmma_ws"       # '' forces nothing
    assert choose("float32", 64, cc=90, override="wgmma:32,2,1").variant.config == (32, 2, 1)


def test_accumulating_instantiation_is_tma16s_float32_output():
    c = choose("float16", 128, cc=90, override="")
    config = ",".join(map(str, registry.TMA16.defaults[128]))
    assert c.accumulating().name == f"dilated_fwd_tma_16<f16_t,128,{config},float>"
    with pytest.raises(ValueError, match="needs tma16"):
        choose("float16", 32, cc=90, override="wgmma16").accumulating()


def test_every_instantiation_the_check_compiles_comes_from_the_registry(monkeypatch):
    """check.main compiles the registry's instantiations (PTX per source, ptxas per sm_90a instantiation) and
    nothing else but the plain sources and the helper programs (each for the architectures that run it)."""
    compiled: list[tuple] = []
    monkeypatch.setattr(check, "compile_ptx", lambda arch, name: compiled.append(("ptx", arch, name)) or
                        {"ptx_bytes": "1"})
    monkeypatch.setattr(check, "compile_plain", lambda arch, name: compiled.append(("plain", arch, name)) or 1)
    monkeypatch.setattr(check, "compile_helper", lambda arch, p: compiled.append(("helper", arch, p.source)) or 1)
    monkeypatch.setattr(check, "arch_ptxas_report", lambda v: compiled.append(("ptxas", v.arch, v)) or
                        {"registers": 1, "stack": 0, "spill_stores": 0, "spill_loads": 0, "serialized": False})
    import sys
    import types

    # main prints the NVRTC version: a stand-in, so the test runs without CuPy too
    monkeypatch.setitem(sys.modules, "cupy.cuda.nvrtc", types.SimpleNamespace(getVersion=lambda: (12, 9)))
    monkeypatch.setitem(sys.modules, "cupy.cuda", types.SimpleNamespace(nvrtc=sys.modules["cupy.cuda.nvrtc"]))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=sys.modules["cupy.cuda"]))
    check.main()
    sources = {f.source for f in FAMILIES.values()}
    assert {name for kind, _, name in compiled if kind == "ptx"} == sources
    assert {name for kind, _, name in compiled if kind == "plain"} == set(check.PLAIN_SOURCES)
    helpers = {(arch, name) for kind, arch, name in compiled if kind == "helper"}
    assert helpers == {(a, "row_dot.cu") for a in check.CHECK_ARCHS} | {("compute_80", "convert_16.cu"),
                                                                        ("compute_90", "convert_16.cu")}
    ptxas = [v for kind, _, v in compiled if kind == "ptxas"]
    assert ptxas == [v for v in registry.instantiations() if v.arch]
    for kind, arch, name in compiled:
        if kind == "ptx":
            assert arch in check.archs_for(name)


def test_instantiations_are_each_familys_configurations():
    seen = registry.instantiations()
    forward, fma_bwd, mma16_bwd, tf32x3_bwd, wgmma16_bwd = 138, 24, 16, 8, 42
    assert len(seen) == len(set(seen)) == forward + fma_bwd + mma16_bwd + tf32x3_bwd + wgmma16_bwd
    for f in FAMILIES.values():
        mine = [v for v in seen if v.variant == f.name]
        assert mine == f.instantiations()
        assert {v.source for v in mine} == {f.source}
        assert {v.head_dim for v in mine} == set(f.head_dims) <= set(HEAD_DIMS)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_defaults_and_alternatives_fit_the_familys_shared_memory(name):
    """Every configuration CI compiles fits the opt-in shared memory of the oldest GPU the family runs on
    (its own limit: Hopper's 227 KiB for the sm_90a families), except the FP32 tiled/tensor-core blocks,
    which selection skips where they do not fit (warp always fits Pascal's 48 KiB)."""
    f = FAMILIES[name]
    limit = f.max_shared or max(SHARED_OPTIN.values())
    for d in f.head_dims:
        for cfg in f.configurations(d):
            v = f.variant(d, f.dtypes[0], cfg)
            assert v.shared_bytes <= limit, (v.name, v.shared_bytes)
    if name == "warp":
        assert all(f.variant(d).shared_bytes <= 48 * 1024 for d in f.head_dims)
    if name == "mma16":
        # the defaults fit compute capability 8.6/8.9's 99 KiB (two blocks per SM on 8.0)
        assert all(f.variant(d, "bfloat16").shared_bytes <= 99 * 1024 for d in f.head_dims)


def test_a_forced_configuration_is_checked_against_the_family():
    with pytest.raises(RuntimeError,
                       match="HILBERT_HPC_HALF_KERNEL=tma16:64,2,3: tma16 takes BK,NC,STAGES,PIPE,LAZY,PINGPONG,PERSISTENT"):
        choose("bfloat16", 64, cc=90, override="tma16:64,2,3")
    with pytest.raises(ValueError, match=r"tma16 configuration \(BK, NC, STAGES, PIPE, LAZY, PINGPONG, PERSISTENT\)"):
        choose("bfloat16", 64, cc=90, override="tma16:60,2,3,1,1,0,0")
    with pytest.raises(RuntimeError, match="unknown FP32 kernel variant 'mma16'"):
        choose("float32", 64, cc=90, override="mma16")


def test_planned_choice_is_hopper_without_a_gpu():
    from hilbert_hpc.kernels.selection import planned_choice

    assert planned_choice("bfloat16", 64, cc=90).name == "tma16"
    assert planned_choice("bfloat16", 64, cc=80).scratch_heads(12) == 0
    assert planned_choice("bfloat16", 48, cc=90) is None                     # run refuses it with the reason
