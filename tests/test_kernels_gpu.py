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
from hilbert_hpc.inputs import random_rows  # noqa: E402
from hilbert_hpc.patterns import Pattern  # noqa: E402


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


@pytest.mark.parametrize("variant", ["warp", "tiled64", "tiled128", "tf32x3"])
@pytest.mark.parametrize("seed", range(6))
def test_every_kernel_variant_matches_float64_reference(variant, seed, monkeypatch):
    from hilbert_hpc import kernels

    monkeypatch.setenv(kernels.VARIANT_ENV, variant)
    cfg = random_config(seed + 700, dims=(32, 64, 96, 128))
    chosen = kernels.variant(variant, cfg["head_dim"])
    if chosen.shared_bytes > kernels._shared_limit() or chosen.min_cc > kernels._compute_capability():
        pytest.skip(f"{variant} for head_dim {cfg['head_dim']} does not run on this GPU")
    assert fused_against_reference(cfg, seed)[2] < 1e-5, cfg


@pytest.mark.parametrize("causal", [False, True])
def test_tensor_core_kernel_agrees_with_the_fp32_fma_kernel(causal, monkeypatch):
    """Long segments, every head dimension: the split-TF32 kernel stays within FP32 rounding of the FMA one."""
    from hilbert_hpc import kernels

    if kernels._compute_capability() < 80:
        pytest.skip("tf32x3 needs compute capability 8.0")
    rng = np.random.default_rng(11)
    for d in kernels.HEAD_DIMS:
        q, k, v = (rng.standard_normal((4096, 2, d)).astype(np.float32) for _ in range(3))
        pats = [(512, 1), (2048, 2), (4096, 8)]
        outs = {}
        for name in ("tiled64", "tf32x3"):
            monkeypatch.setenv(kernels.VARIANT_ENV, name)
            outs[name] = dilated_attention(q, k, v, patterns=pats, causal=causal, backend="cuda-fp32")
        want = dense_dilated_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), pats, causal)
        assert rel_err(outs["tf32x3"], want) < 2 * rel_err(outs["tiled64"], want) + 1e-7, d


def test_large_magnitude_inputs_stay_finite():
    rng = np.random.default_rng(3)
    n, h, d = 1024, 4, 64
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

    from hilbert_hpc import fused
    from hilbert_hpc.mpi import bind_gpu
    from hilbert_hpc.ring import ring_dilated_attention
    from hilbert_hpc.sharding import Layout
    from hilbert_hpc.transports import resolve_transport

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
                                 transport=transport, kernels=fused)
    assert rel_err(cupy.asnumpy(got), want) < 1e-5
