"""The 16-bit kernels (dilated_fwd_wgmma_16.cu for Hopper, dilated_fwd_mma_16.cu for compute capability 8.0+)
and their provider (kernels/sixteen_bit.py), without a GPU.

NVRTC compiles every instantiation for compute_90a (PTX with wgmma .bf16 / .f16) and to an sm_90a cubin
through its ptxas (-v): no spills, wgmma not serialized, shared memory within Hopper's 227 KiB. The
provider refuses other compute capabilities with a message that names the dtype and the GPU's
compute capability. The shared-memory layouts are checked against the PTX ISA canonical layouts.
"""

from __future__ import annotations

import re

import pytest

from hilbert_hpc.kernels import program, sixteen_bit
from hilbert_hpc.kernels.registry import (HEAD_DIMS, HOPPER_SHARED, MMA16, SIXTEEN_BIT_TYPES, TMA16, WGMMA16,
                                          mma16_shared_bytes)
from hilbert_hpc.kernels.selection import SIXTEEN_BIT_ENV, choose

from nvrtc_probe import HAVE_NVRTC, REQUIRED, needs_nvrtc


def test_nvrtc_present_where_required():
    """CI sets HILBERT_HPC_REQUIRE_NVRTC=1, so the compile checks below cannot silently skip there."""
    assert HAVE_NVRTC or not REQUIRED


def _names(variants):
    return [v.name for v in variants]


@pytest.fixture(scope="module")
def ptx() -> str:
    """The PTX of every instantiation (one NVRTC program, compute_90a)."""
    from hilbert_hpc.kernels.check import compile_templates

    return compile_templates("compute_90a", WGMMA16.source, _names(WGMMA16.instantiations()),
                             program.ARCH_OPTIONS)[1]


@needs_nvrtc
def test_ptx_has_16bit_wgmma(ptx):
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", ptx)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16", ptx)
    assert "cp.async.cg.shared.global" in ptx
    assert "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx      # VMODE 1 configurations
    for v in WGMMA16.instantiations():
        assert v.shared_bytes <= HOPPER_SHARED, v.name


@needs_nvrtc
@pytest.mark.parametrize("v", WGMMA16.instantiations(), ids=_names(WGMMA16.instantiations()))
def test_sm90a_cubin_without_spills(v):
    from hilbert_hpc.kernels.check import arch_ptxas_report

    r = arch_ptxas_report(v)
    assert r["cubin_bytes"] > 0 and r["registers"] > 0, r["log"]
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, f"{v.name}: spills\n{r['log']}"
    assert r["registers"] <= 255
    assert not r["serialized"], f"{v.name}: ptxas serialized wgmma\n{r['log']}"


@pytest.mark.parametrize("cc", [61, 70, 75])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_choose_refuses_gpus_without_16bit_tensor_cores(monkeypatch, cc, dtype):
    monkeypatch.setattr(program, "compute_capability", lambda: cc)
    monkeypatch.setattr(program, "shared_limit", lambda: 48 * 1024)
    with pytest.raises(RuntimeError) as info:
        choose(dtype, 64)
    msg = str(info.value)
    assert f"dtype {dtype} needs 16-bit tensor cores (compute capability 8.0 or newer)" in msg
    assert f"this GPU has {cc / 10:.1f}" in msg


@pytest.mark.parametrize("cc,limit", [(80, 163 * 1024), (86, 99 * 1024), (89, 99 * 1024), (100, 227 * 1024),
                                      (120, 99 * 1024)])
def test_choose_takes_mma16_off_hopper(monkeypatch, cc, limit):
    """A100, A10/L40S, RTX 30/40 and Blackwell run mma16; every default configuration fits their shared memory."""
    monkeypatch.setattr(program, "compute_capability", lambda: cc)
    monkeypatch.setattr(program, "shared_limit", lambda: limit)
    monkeypatch.delenv(SIXTEEN_BIT_ENV, raising=False)
    for d in HEAD_DIMS:
        for dt, t in SIXTEEN_BIT_TYPES.items():
            v = select_16(d, dt)
            assert v.variant == "mma16" and v.arch is None and v.min_cc == 80
            assert v.name == f"dilated_fwd_mma_16<{t},{d},{MMA16.defaults[d][0]}>"
            assert v.threads == 128 and v.block_queries == 64 and v.shared_bytes <= limit
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "wgmma16")
    with pytest.raises(RuntimeError, match="runs on compute capability 9.0 only"):
        select_16(64, "bfloat16")
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "mma16:64")
    if mma16_shared_bytes(128, 64) > limit:
        with pytest.raises(RuntimeError, match="bytes of shared memory"):
            select_16(128, "bfloat16")
    else:
        assert select_16(128, "bfloat16").name == "dilated_fwd_mma_16<bf16_t,128,64>"


def select_16(head_dim: int, dtype):
    """The 16-bit variant the (monkeypatched) device runs."""
    return choose(dtype, head_dim).variant


#: the Hopper family per head dim (tma16 where it has the head dim)
HOPPER_DEFAULT = {32: "tma16", 64: "tma16", 96: "tma16", 128: "tma16"}


def test_choose_on_hopper(monkeypatch):
    monkeypatch.setattr(program, "compute_capability", lambda: 90)
    monkeypatch.setattr(program, "shared_limit", lambda: 227 * 1024)
    monkeypatch.delenv(SIXTEEN_BIT_ENV, raising=False)
    for d in HEAD_DIMS:
        for dt, t in SIXTEEN_BIT_TYPES.items():
            v = select_16(d, dt)
            assert v.variant == HOPPER_DEFAULT[d]
            if v.variant == "tma16":
                keys, nc = TMA16.defaults[d][:2]
                assert v.name == f"dilated_fwd_tma_16<{t},{d},{','.join(map(str, TMA16.defaults[d]))},{t}>"
                assert (v.threads, v.block_queries, v.config) == (128 * (nc + 1), 64 * nc, TMA16.defaults[d])
            else:
                keys, wgs, vmode = WGMMA16.defaults[d]
                assert v.name == f"dilated_fwd_wgmma_16<{t},{d},{keys},{wgs},{vmode}>"
                assert (v.threads, v.block_queries) == (128 * wgs, 64 * wgs)
            assert (v.align, v.arch) == (8, "sm_90a")
            assert v.runs_on(90) and not v.runs_on(86) and not v.runs_on(100)
    assert {HOPPER_DEFAULT[d] for d in TMA16.head_dims} == {"tma16"}
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "tma16:128,2,3,0,1,1,1")
    assert select_16(128, "bf16").name == "dilated_fwd_tma_16<bf16_t,128,128,2,3,0,1,1,1,bf16_t>"
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "tma16")
    assert select_16(64, "float16").name == TMA16.variant(64, "float16").name
    for bad in ("tma16:64,2,3,1,1,0", "tma16:64,5,3,1,1,0,0", "tma16:60,2,3,1,1,0,0", "tma16:64,2,1,1,1,0,0",
                "tma16:64,2,3,1,2,0,0", "tma16:64,2,3,1,1,2,0", "tma16:64,2,3,1,1,0,2"):
        monkeypatch.setenv(SIXTEEN_BIT_ENV, bad)
        with pytest.raises((RuntimeError, ValueError), match="HILBERT_HPC_HALF_KERNEL|tma16 configuration"):
            select_16(64, "bfloat16")
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "tma16:128,2,4,0,1,0,0")      # 262 KiB: over Hopper's 227 KiB
    with pytest.raises(RuntimeError, match="bytes of shared memory"):
        select_16(128, "bfloat16")
    monkeypatch.delenv(SIXTEEN_BIT_ENV)
    monkeypatch.setattr(program, "compute_capability", lambda: 100)
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "tma16")
    with pytest.raises(RuntimeError, match="tma16 runs on compute capability 9.0 only"):
        select_16(64, "bfloat16")
    monkeypatch.setattr(program, "compute_capability", lambda: 90)
    assert select_16(64, "torch.bfloat16") == select_16(64, "bf16")
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "wgmma16:64,1,1")
    assert select_16(128, "float16").name == "dilated_fwd_wgmma_16<f16_t,128,64,1,1>"
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "mma16")
    assert select_16(64, "float16").name == "dilated_fwd_mma_16<f16_t,64,64>"
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "tf32x3")
    with pytest.raises(RuntimeError, match="HILBERT_HPC_HALF_KERNEL"):
        select_16(64, "bfloat16")
    for bad in ("mma16:64,2,1", "wgmma16:64", "mma16:x"):
        monkeypatch.setenv(SIXTEEN_BIT_ENV, bad)
        with pytest.raises(RuntimeError, match="HILBERT_HPC_HALF_KERNEL"):
            select_16(64, "bfloat16")
    with pytest.raises(ValueError, match="head_dim"):
        WGMMA16.variant(80, "bfloat16")
    with pytest.raises(ValueError, match="dtype"):
        WGMMA16.variant(64, "float32")


def test_launch_geometry_matches_fused(monkeypatch):
    """launch_local_patterns hands the wgmma16 kernel the geometry of fused.local_patterns, pointers as uint64
    (tma16's tensor maps: tests/test_tma16.py)."""
    import numpy as np

    monkeypatch.setattr(program, "compute_capability", lambda: 90)
    monkeypatch.setattr(program, "shared_limit", lambda: 227 * 1024)
    monkeypatch.setenv(SIXTEEN_BIT_ENV, "wgmma16")
    calls = []
    monkeypatch.setattr(sixteen_bit, "compiled",
                        lambda v: lambda grid, block, args, shared_mem=0: calls.append((v, grid, block, args, shared_mem)))
    n, h, d = 8192, 6, 64
    sixteen_bit.launch_local_patterns(0x1000, 0x2000, 0x3000, [(2048, 1), (4096, 2), (8192, 4)], True, 0.125, 0x4000,
                                      0x5000, shape=(n, h, d), dtype="bfloat16")
    assert len(calls) == 1 + 2 + 4
    row = h * d
    v, grid, block, args, shared = calls[2]                 # pattern (4096, 2), head offset 1
    assert all(isinstance(a, np.uint64) for a in args[:5]) and int(args[3]) == 0x4000
    assert grid == (n // 4096 * 3, 2048 // 128) and block == (256,) and shared == v.shared_bytes
    assert [int(x) for x in args[5:9]] == [row + d, 4096 * row, 2 * d, 2 * row]
    assert [int(x) for x in args[17:21]] == [h + 1, 4096 * h, 2, 2 * h]
    assert [int(x) for x in args[21:26]] == [3, 2048, 2048, 1, 0] and float(args[26]) == 0.125
    with pytest.raises(ValueError, match="head_dim"):
        sixteen_bit.launch_local_patterns(0, 0, 0, [(16, 1)], False, 0.1, 0, 0, shape=(16, 2, 36), dtype="float16")
    with pytest.raises(ValueError, match="aligned"):
        sixteen_bit.launch_local_patterns(0x1008, 0, 0, [(16, 1)], False, 0.1, 0, 0, shape=(16, 2, 64), dtype="float16")


def _canonical_offset(major: str, mn: int, kk: int, lbo: int, sbo: int) -> int:
    """Byte offset of element (mn, k) of a 16-bit no-swizzle operand, PTX ISA canonical layouts (T = 8):
    K-major ((8,m),(T,2k)):((1T,SBO),(1,LBO)); MN-major ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))."""
    if major == "K":
        return (mn % 8) * 16 + (mn // 8) * sbo + (kk % 8) * 2 + (kk // 8) * lbo
    return (mn % 8) * 2 + (mn // 8) * sbo + (kk % 8) * 16 + (kk // 8) * lbo


def _tile_offset(row: int, col: int, d: int) -> int:
    """Byte offset of (row, col) in a tile stored [row / 8][col / 8][row % 8][8] (load_rows_async)."""
    return (row // 8) * 16 * d + (col // 8) * 128 + (row % 8) * 16 + (col % 8) * 2


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_descriptors_address_the_loaded_tiles(d):
    """The descriptor fields and k-step offsets of the kernel address exactly the elements it means."""
    bk = 128
    # Q / K, K-major (A of Q K^T: rows = queries; B: rows = keys): LBO 128, SBO 16 D, k-step ks at 256 ks
    for ks in range(d // 16):
        for row in range(0, 64, 7):
            for kk in range(16):
                assert 256 * ks + _canonical_offset("K", row, kk, 128, 16 * d) == _tile_offset(row, 16 * ks + kk, d)
    # V, VMODE 0, MN-major (B of P V: K = keys, N = d): LBO 16 D, SBO 128, k-step kk at 32 D kk bytes
    for kstep in range(bk // 16):
        for n in range(d):
            for kk in range(16):
                key = 16 * kstep + kk
                assert 32 * d * kstep + _canonical_offset("MN", n, kk, 16 * d, 128) == _tile_offset(key, n, d)
    # V^T, VMODE 1, K-major (N = d, K = keys), [d / 8][key / 8][d % 8][8]: LBO 128, SBO 16 BK, k-step at 256
    for kstep in range(bk // 16):
        for n in range(d):
            for kk in range(16):
                key = 16 * kstep + kk
                want = (n // 8) * 16 * bk + (key // 8) * 128 + (n % 8) * 16 + (key % 8) * 2
                assert 256 * kstep + _canonical_offset("K", n, kk, 128, 16 * bk) == want


def test_accumulator_is_the_a_fragment():
    """Accumulator element 8 kk + r is element r of the k16 A fragment of k-step kk (PTX ISA fragment figures:
    accumulator d[4i + 2h + e] = (g + 8h, 8i + 2t + e); A element r = (g + 8 ((r >> 1) & 1), 8 (r >> 2) + 2t + (r & 1)))."""
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for kk in range(8):
            for r in range(8):
                idx = 8 * kk + r
                i, h, e = idx // 4, (idx // 2) % 2, idx % 2
                acc = (g + 8 * h, 8 * i + 2 * t + e)
                a = (g + 8 * ((r >> 1) & 1), 16 * kk + 8 * (r >> 2) + 2 * t + (r & 1))
                assert acc == a


@pytest.fixture(scope="module", params=["compute_80", "compute_90"])
def mma16_ptx(request) -> str:
    """The PTX of every mma16 instantiation for compute_80 and compute_90 (one NVRTC program each)."""
    from hilbert_hpc.kernels.check import compile_templates

    return compile_templates(request.param, MMA16.source, _names(MMA16.instantiations()))[1]


@needs_nvrtc
def test_mma16_ptx_has_16bit_mma_sync(mma16_ptx):
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in mma16_ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in mma16_ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in mma16_ptx
    assert "cp.async.cg.shared.global" in mma16_ptx
    assert "wgmma" not in mma16_ptx


@needs_nvrtc
@pytest.mark.parametrize("v", MMA16.instantiations(), ids=_names(MMA16.instantiations()))
def test_mma16_sm80_cubin_without_spills(v):
    import dataclasses

    from hilbert_hpc.kernels.check import arch_ptxas_report

    r = arch_ptxas_report(dataclasses.replace(v, arch="sm_80"))
    assert r["cubin_bytes"] > 0 and r["registers"] > 0, r["log"]
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, f"{v.name}: spills\n{r['log']}"


def test_mma16_launch_geometry(monkeypatch):
    """Off Hopper the provider launches mma16 with the same geometry: 128 threads per 64 queries."""
    monkeypatch.setattr(program, "compute_capability", lambda: 80)
    monkeypatch.setattr(program, "shared_limit", lambda: 163 * 1024)
    monkeypatch.delenv(SIXTEEN_BIT_ENV, raising=False)
    calls = []
    monkeypatch.setattr(sixteen_bit, "compiled",
                        lambda v: lambda grid, block, args, shared_mem=0: calls.append((v, grid, block, shared_mem)))
    sixteen_bit.launch_local_patterns(0x1000, 0x2000, 0x3000, [(4096, 2)], False, 0.125, 0x4000, 0x5000,
                                      shape=(8192, 6, 128), dtype="float16")
    assert len(calls) == 2
    v, grid, block, shared = calls[0]
    assert v.variant == "mma16" and grid == (2 * 3, 2048 // 64) and block == (128,) and shared == v.shared_bytes
