"""Every kernel source compiles for compute_61, 70, 80 and 90 with NVRTC 12 (no GPU needed); the wgmma
kernel for compute_90a only, and to an sm_90a cubin without spills."""

from __future__ import annotations


import pytest

from hilbert_hpc.kernels import program, registry
from hilbert_hpc.kernels.check import CHECK_ARCHS, archs_for
from hilbert_hpc.kernels.compile import nvrtc_compile
from hilbert_hpc.kernels.registry import HEAD_DIMS, TF32X3, TILED64, WARP, WGMMA
from hilbert_hpc.kernels.selection import FP32_ENV, choose

from nvrtc_probe import HAVE_NVRTC, REQUIRED, needs_nvrtc


def test_nvrtc_present_where_required():
    """CI sets HILBERT_HPC_REQUIRE_NVRTC=1, so the compile checks below cannot silently skip there."""
    assert HAVE_NVRTC or not REQUIRED


FP32_SOURCES = tuple(dict.fromkeys(f.source for f in registry.families_for("float32")))
FP32_TARGETS = [(name, arch) for name in FP32_SOURCES for arch in archs_for(name)]


@needs_nvrtc
@pytest.mark.parametrize("name, arch", FP32_TARGETS)
def test_fp32_kernels_compile(arch, name):
    from hilbert_hpc.kernels.check import compile_ptx

    info = compile_ptx(arch, name)
    assert int(info["ptx_bytes"]) > 1000
    assert len(info) - 1 == sum(len(f.instantiations()) for f in registry.families_for("float32") if f.source == name)
    assert all(v for k, v in info.items())
    if name == TF32X3.source:
        from hilbert_hpc.kernels.check import compile_templates

        assert "mma.sync.aligned.m16n8k8" in compile_templates(arch, name)[1]


@needs_nvrtc
def test_wgmma_kernel_uses_warpgroup_mma():
    """The PTX for compute_90a really uses wgmma (TF32, m64nNk8), shared-memory fences and no mma.sync."""
    from hilbert_hpc.kernels.check import compile_templates

    ptx = compile_templates("compute_90a", WGMMA.source)[1]
    assert "wgmma.mma_async.sync.aligned.m64n" in ptx and ".f32.tf32.tf32" in ptx
    assert "wgmma.fence.sync.aligned" in ptx and "wgmma.wait_group.sync.aligned" in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    assert "mma.sync" not in ptx


@needs_nvrtc
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_wgmma_kernel_has_no_spills_for_sm_90a(head_dim):
    """ptxas (through NVRTC) for sm_90a: no local memory, at most 255 registers, wgmma not serialized."""
    from hilbert_hpc.kernels.check import arch_ptxas_report

    r = arch_ptxas_report(WGMMA.variant(head_dim))
    assert 0 < r["registers"] <= 255, r["log"]
    assert (r["stack"], r["spill_stores"], r["spill_loads"]) == (0, 0, 0), r["log"]
    assert not r["serialized"], r["log"]
    assert r["cubin_bytes"] > 1000


@needs_nvrtc
def test_wgmma_shared_bytes_match_the_source():
    """registry.wgmma_shared_bytes follows WgmmaSmem<D, BK, WG>::floats of the .cu (read back from the PTX)."""
    import re

    configs = sorted({WGMMA.defaults[d][:2] + (d,) for d in HEAD_DIMS} | {(64, 2, 64), (32, 1, 128)})
    text = program.source(WGMMA.source) + "\n__device__ int wgmma_smem_floats[] = {" + ", ".join(
        f"WgmmaSmem<{d}, {bk}, {wg}>::floats" for bk, wg, d in configs) + "};\n"
    ptx = nvrtc_compile(text, "smem_check.cu", options=program.OPTIONS, target="compute_90a", output="ptx").binary
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    raw = [int(x) for x in re.search(r"wgmma_smem_floats\[\d+\] = \{([^}]*)\}", ptx).group(1).split(",")]
    if ".b8 wgmma_smem_floats" in ptx:               # a byte array: little-endian words, trailing zeros left out
        raw += [0] * (4 * len(configs) - len(raw))
        raw = [int.from_bytes(bytes(raw[i:i + 4]), "little") for i in range(0, len(raw), 4)]
    values = raw
    assert values == [registry.wgmma_shared_bytes(d, bk, wg) // 4 for bk, wg, d in configs]


def test_tensor_core_source_is_checked_only_where_it_can_run():
    assert archs_for(TF32X3.source) == ("compute_80", "compute_90")
    assert archs_for(WGMMA.source) == ("compute_90a",)
    assert archs_for(TILED64.source) == CHECK_ARCHS


@needs_nvrtc
@pytest.mark.parametrize("arch", CHECK_ARCHS)
def test_hilbert_key_kernel_compiles(arch):
    from hilbert_hpc.kernels.check import PLAIN_SOURCES, compile_plain

    assert all(compile_plain(arch, name) > 1000 for name in PLAIN_SOURCES)


def test_every_kernel_source_is_checked():
    from hilbert_hpc.kernels.check import PLAIN_SOURCES, TEMPLATE_SOURCES, helper_programs
    from hilbert_hpc.kernels.sixteen_bit import CONVERT_SOURCE

    on_disk = {p.name for p in program.KERNEL_DIR.glob("*.cu")}
    helpers = {p.source for p, _ in helper_programs()}
    assert CONVERT_SOURCE in helpers and on_disk == {*TEMPLATE_SOURCES, *helpers, *PLAIN_SOURCES}
    assert set(TEMPLATE_SOURCES) == {f.source for f in registry.FAMILIES.values()}
    headers = {p.name for p in program.KERNEL_DIR.glob("*.cuh")}
    assert headers == set(program.HEADERS)


def test_unsupported_head_dim_is_a_clear_error():
    with pytest.raises(ValueError, match="head_dim"):
        WARP.variant(48)
    with pytest.raises(ValueError, match="head_dim.*backend 'cupy'"):
        registry.check_head_dim("float32", 48)


def test_shared_memory_fits_pascal():
    """Every head_dim has a variant within Pascal's 48 KiB per block; the tiled64 one for D <= 64."""
    assert all(WARP.variant(d).shared_bytes <= 48 * 1024 for d in HEAD_DIMS)
    assert all(TILED64.variant(d).shared_bytes <= 48 * 1024 for d in (32, 64))


def _device(monkeypatch, cc: int, shared_kib: int) -> None:
    monkeypatch.setattr(program, "compute_capability", lambda: cc)
    monkeypatch.setattr(program, "shared_limit", lambda: shared_kib * 1024)


def select_fp32(head_dim: int, align: int = 4):
    """The FP32 variant the (monkeypatched) device runs for ``head_dim`` on rows aligned to ``align``."""
    return choose("float32", head_dim).for_alignment(align)


def test_variant_selection_respects_capability_shared_memory_and_alignment(monkeypatch):
    monkeypatch.delenv(FP32_ENV, raising=False)
    _device(monkeypatch, 61, 48)                                       # a Pascal GPU
    assert select_fp32(64).variant == "tiled64"
    assert select_fp32(128).variant == "warp"
    assert select_fp32(64, align=2).variant == "warp"
    _device(monkeypatch, 70, 96)                                       # V100: no TF32 tensor cores
    assert select_fp32(64).variant == "tiled128"
    _device(monkeypatch, 90, 227)                                      # H100, H200: wgmma_ws (sm_90a)
    assert [f.name for f in registry.families_for("float32")][:3] == ["wgmma_ws", "wgmma", "tf32x3"]
    assert all(select_fp32(d).variant == "wgmma_ws" for d in HEAD_DIMS)
    assert select_fp32(64, align=2).variant == "warp"
    _device(monkeypatch, 89, 99)                                       # L40S / RTX 4090: no wgmma
    assert all(select_fp32(d).variant == "tf32x3" for d in HEAD_DIMS)
    for cc in (100, 120):                                              # Blackwell: sm_90a code does not run there
        _device(monkeypatch, cc, 227)
        assert all(select_fp32(d).variant == "tf32x3" for d in HEAD_DIMS)
    _device(monkeypatch, 80, 163)                                      # A100
    assert select_fp32(128).variant == "tf32x3"
    monkeypatch.setenv(FP32_ENV, "tf32x3")
    _device(monkeypatch, 61, 48)
    with pytest.raises(RuntimeError, match="compute capability 8.0"):
        select_fp32(64)
    monkeypatch.setenv(FP32_ENV, "wgmma")
    _device(monkeypatch, 80, 163)
    with pytest.raises(RuntimeError, match="compute capability 9.0"):
        select_fp32(64)
    _device(monkeypatch, 100, 227)
    with pytest.raises(RuntimeError, match="sm_90a"):
        select_fp32(64)
    _device(monkeypatch, 90, 227)
    assert select_fp32(128).variant == "wgmma"
    with pytest.raises(RuntimeError, match="aligned"):
        select_fp32(64, align=2)
    monkeypatch.setenv(FP32_ENV, "warp")
    assert select_fp32(64).variant == "warp"
    monkeypatch.setenv(FP32_ENV, "tiled9")
    with pytest.raises(RuntimeError, match="variant"):
        select_fp32(64)


def test_launch_geometry_matches_the_tensor_core_source():
    """The Python launch description (queries per block, key tile, shared bytes) follows the .cu constants."""
    import re

    text = (program.KERNEL_DIR / TF32X3.source).read_text()
    warps = int(re.search(r"#define MMA_WARPS (\d+)", text).group(1))
    keys = int(re.search(r"#define MMA_BK (\d+)", text).group(1))
    assert (32 * warps, 16 * warps, keys) == (TF32X3.threads(()), TF32X3.block_queries(64, ()), registry.MMA_KEYS)
    for d in HEAD_DIMS:
        v = TF32X3.variant(d)
        assert v.shared_bytes == 4 * (16 * warps + 4 * keys) * (d + 4) and v.min_cc == 80 and v.align == 4


def test_wgmma_launch_geometry():
    """Blocks of one or two warpgroups x 64 queries, sm_90a only, within an H100/H200 block's 227 KiB."""
    for d in HEAD_DIMS:
        v = WGMMA.variant(d)
        keys, wgs, parts = WGMMA.defaults[d]
        assert (v.threads, v.block_queries, v.align) == (128 * wgs, 64 * wgs, 4)
        assert (v.min_cc, v.max_cc, v.arch) == (90, 90, "sm_90a") and v.runs_on(90) and not v.runs_on(100)
        assert v.name == f"dilated_fwd_wgmma_tf32<{d},{keys},{wgs},{parts}>"
        assert keys % 16 == 0 and (d // parts) % 8 == 0 and (d // 8) % 2 == 0
        assert v.shared_bytes <= 227 * 1024
    assert all(not registry.family(n).variant(64).arch and registry.family(n).variant(64).runs_on(120)
               for n in ("tf32x3", "tiled128", "tiled64", "warp"))


@needs_nvrtc
@pytest.mark.parametrize("family", ["tf32x3", "tf32x3_bwd"])
def test_tf32_rounding_is_one_instruction_on_hopper_and_cvt_rna_before(family):
    """The split-TF32 kernels round FP32 to TF32 with cvt.rn on compute capability 9.0 (one instruction) and with
    cvt.rna before it, where cvt.rn for TF32 does not exist: the sm_80 path is unchanged."""
    from hilbert_hpc.kernels.check import compile_templates

    v = registry.family(family).variant(64, "float32")
    for arch, used, unused in (("compute_80", "cvt.rna.tf32.f32", "cvt.rn.tf32.f32"),
                               ("compute_90", "cvt.rn.tf32.f32", "cvt.rna.tf32.f32")):
        ptx = compile_templates(arch, v.source, [v.name])[1]
        assert used in ptx and unused not in ptx, (family, arch)
