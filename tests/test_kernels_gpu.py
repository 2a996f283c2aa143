"""The fused FP32 kernel on a GPU: against the float64 reference, the NumPy backend, and in the 2-GPU ring."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_available, random_config, random_qkv, rel_err
from dense_reference import dense_dilated_attention

cupy = pytest.importorskip("cupy")
HAVE_GPU = gpu_available()

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU")]

from hilbert_hpc import dilated_attention, serialization_order  # noqa: E402
from hilbert_hpc.core.inputs import random_rows  # noqa: E402
from hilbert_hpc.core.patterns import Pattern  # noqa: E402


def fused_against_reference(cfg: dict, seed: int) -> tuple:
    """(fp32 inputs, fused output, error against the float64 dense reference) of a random problem."""
    q, k, v = random_qkv(cfg, seed)
    perm = serialization_order(cfg["grid"], cfg["ordering"])
    want = dense_dilated_attention(q, k, v, cfg["patterns"], cfg["causal"], perm)
    inputs32 = [x.astype(np.float32) for x in (q, k, v)]
    got = dilated_attention(*inputs32, patterns=cfg["patterns"], causal=cfg["causal"], grid=cfg["grid"],
                            ordering=cfg["ordering"], backend="cuda-fp32")
    return inputs32, got, rel_err(got, want)


@pytest.mark.parametrize("seed", range(16))
def test_fused_kernel_matches_float64_reference(seed):
    cfg = random_config(seed + 500, dims=(32, 64, 96, 128))
    (q, k, v), got, err = fused_against_reference(cfg, seed)
    assert err < 1e-5, cfg
    ref32 = dilated_attention(q, k, v, patterns=cfg["patterns"],
                              causal=cfg["causal"], grid=cfg["grid"], ordering=cfg["ordering"], backend="numpy")
    assert rel_err(got, ref32) < 1e-5


VARIANTS = ["warp", "tiled64", "tiled128", "tf32x3", "wgmma", "wgmma_ws"]
TENSOR_CORE_VARIANTS = ["tf32x3", "wgmma", "wgmma_ws"]


def skip_unless_runs(variant: str, head_dim: int) -> None:
    """Skip where this GPU cannot run ``variant`` (compute capability, e.g. wgmma: 9.0 only; shared memory)."""
    from hilbert_hpc.kernels import program, registry

    chosen = registry.family(variant).variant(head_dim)
    cc = program.compute_capability()
    if chosen.shared_bytes > program.shared_limit() or not chosen.runs_on(cc):
        pytest.skip(f"{variant} for head_dim {head_dim} does not run on this GPU (compute capability {cc / 10:.1f})")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", range(6))
def test_every_kernel_variant_matches_float64_reference(variant, seed, monkeypatch):
    from hilbert_hpc.kernels import registry, selection

    monkeypatch.setenv(selection.FP32_ENV, variant)
    cfg = random_config(seed + 700, dims=(32, 64, 96, 128))
    skip_unless_runs(variant, cfg["head_dim"])
    assert fused_against_reference(cfg, seed)[2] < 1e-5, cfg


@pytest.mark.parametrize("variant", TENSOR_CORE_VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
def test_tensor_core_kernel_agrees_with_the_fp32_fma_kernel(variant, causal, monkeypatch):
    """Long segments, every head dimension: the split-TF32 kernels stay within FP32 rounding of the FMA one."""
    from hilbert_hpc.kernels import registry, selection

    skip_unless_runs(variant, 64)
    rng = np.random.default_rng(11)
    for d in registry.HEAD_DIMS:
        q, k, v = (rng.standard_normal((4096, 2, d)).astype(np.float32) for _ in range(3))
        pats = [(512, 1), (2048, 2), (4096, 8)]
        outs = {}
        for name in ("tiled64", variant):
            monkeypatch.setenv(selection.FP32_ENV, name)
            outs[name] = dilated_attention(q, k, v, patterns=pats, causal=causal, backend="cuda-fp32")
        want = dense_dilated_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), pats, causal)
        assert rel_err(outs[variant], want) < 2 * rel_err(outs["tiled64"], want) + 1e-7, d


@pytest.mark.parametrize("variant", ["wgmma", "wgmma_ws"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128])
def test_wgmma_kernel_has_fp32_accuracy(head_dim, causal, variant, monkeypatch):
    """wgmma and its warp-specialized form (H100/H200): relative error <= 1e-6 against float64 on long segments
    with ragged ends (a partial last key tile, query blocks past the end, dilated and strided rows), and against
    NumPy."""
    from hilbert_hpc.kernels import registry, selection

    skip_unless_runs(variant, head_dim)
    monkeypatch.setenv(selection.FP32_ENV, variant)
    rng = np.random.default_rng(head_dim + 2 * causal)
    n, heads = 3000, 3                         # segments of 1000 and 3000 keys: no tile size divides them
    q, k, v = (rng.standard_normal((n, heads, head_dim)).astype(np.float32) for _ in range(3))
    pats = [(1000, 1), (3000, 3)]
    got = dilated_attention(q, k, v, patterns=pats, causal=causal, backend="cuda-fp32")
    want = dense_dilated_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), pats, causal)
    assert rel_err(got, want) <= 1e-6, (head_dim, causal, rel_err(got, want))
    ref32 = dilated_attention(q, k, v, patterns=pats, causal=causal, backend="numpy")
    assert rel_err(got, ref32) < 2e-6


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128])
def test_the_warp_specialized_wgmma_gives_the_bits_of_the_all_thread_form(head_dim, causal, monkeypatch):
    """wgmma_ws runs wgmma's products in wgmma's order, its tiles split by a producer warpgroup into a ring of
    stages: with the same tile shape (BK, WG, PARTS) the same output, bit for bit, whatever the number of stages
    (several tiles a block, ragged ends, stages reused many times)."""
    from hilbert_hpc.kernels import registry, selection

    skip_unless_runs("wgmma_ws", head_dim)
    rng = np.random.default_rng(head_dim + 5 * causal)
    q, k, v = (rng.standard_normal((6000, 3, head_dim)).astype(np.float32) for _ in range(3))
    pats = [(1000, 1), (3000, 3), (6000, 2)]
    bk, wg, parts, stages = registry.WGMMA_WS.defaults[head_dim]
    shape = f"{bk},{wg},{parts}"
    forced = [f"wgmma:{shape}", f"wgmma_ws:{shape},{stages}", f"wgmma_ws:{shape},1"]
    outs = {}
    for name in forced:
        monkeypatch.setenv(selection.FP32_ENV, name)
        outs[name] = dilated_attention(q, k, v, patterns=pats, causal=causal, backend="cuda-fp32")
    for name in forced[1:]:
        assert np.array_equal(outs[forced[0]], outs[name]), name


@pytest.mark.parametrize("variant", [None, *TENSOR_CORE_VARIANTS])
def test_large_magnitude_inputs_stay_finite(variant, monkeypatch):
    from hilbert_hpc.kernels import registry, selection

    n, h, d = 1024, 4, 64
    if variant is not None:
        skip_unless_runs(variant, d)
        monkeypatch.setenv(selection.FP32_ENV, variant)
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((n, h, d)) * 300 for _ in range(3))
    pats = [(256, 1), (1024, 4)]
    got = dilated_attention(*(x.astype(np.float32) for x in (q, k, v)), patterns=pats, causal=True,
                            backend="cuda-fp32")
    assert np.isfinite(got).all()
    want = dense_dilated_attention(q, k, v, pats, True)
    assert rel_err(got, want) < 1e-2


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("causal", [False, True])
def test_fused_ring_on_gpus_equals_cpu_ring(causal):
    from mpi4py import MPI

    from hilbert_hpc.kernels.providers import provider
    from hilbert_hpc.kernels.selection import choose
    from hilbert_hpc.distributed.mpi import bind_gpu
    from hilbert_hpc.distributed.ring import ring_dilated_attention
    from hilbert_hpc.distributed.sharding import Layout
    from hilbert_hpc.distributed.transports import resolve_transport

    comm = MPI.COMM_WORLD
    bind_gpu(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    shard, heads, d = 1024, 6, 64
    n = shard * size
    patterns = [Pattern(512, 2), Pattern(n, 8)]
    layout = Layout((n // 32, 32), "hilbert", size)
    host = [random_rows(9, t, layout.shard_natural(rank), heads, d, np.float32) for t in ("q", "k", "v")]
    want = ring_dilated_attention(*(x.astype(np.float64) for x in host), patterns=patterns, comm=comm,
                                  causal=causal)
    transport, _ = resolve_transport("auto", True, comm)
    got = ring_dilated_attention(*(cupy.asarray(x) for x in host), patterns=patterns, comm=comm, causal=causal,
                                 transport=transport,
                                 kernels=provider(choose("float32", d)))
    assert rel_err(cupy.asnumpy(got), want) < 1e-5
