"""hilbert_hpc.nn on CUDA tensors: outputs and gradients on the GPU against the float64 CPU computation.

float64 runs the exact blockwise path on CuPy views (gradcheck), float32/bfloat16/float16 the fused forward and
backward kernels; every result stays on the input's device. The reference is the float64 CPU op (itself equal
to the dense reference to 1e-10: tests/test_nn.py) on the same inputs rounded to the GPU's dtype.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from hilbert_hpc import nn as hnn  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for torch")]

#: (grid, heads, head_dim, patterns, causal, ordering, batch)
CASES = [
    ((1024,), 4, 64, [(256, 1), (512, 2), (1024, 4)], False, "natural", None),
    ((32, 32), 4, 64, [(256, 1), (512, 2), (1024, 4)], True, "hilbert", 2),
    ((768,), 6, 128, [(96, 1), (192, 2), (192, 2)], True, "natural", None),    # a pattern twice: keys twice
    ((8, 8, 8), 3, 32, [(64, 1), (512, 8)], False, "hilbert", None),           # dilation 8 > heads
    ((640,), 2, 96, [(320, 1), (640, 4)], False, "natural", 1),
]
#: max |error| / max |reference| of the output and each gradient
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def make(shape, seed: int, dtype, device):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).to(device) for _ in range(4)]


def shape_of(case):
    grid, heads, d, _, _, _, batch = case
    return (math.prod(grid), heads, d) if batch is None else (batch, math.prod(grid), heads, d)


def run(case, q, k, v, dout):
    """Output and (dq, dk, dv) of hilbert_hpc.nn with the output's gradient ``dout``."""
    grid, _, _, patterns, causal, ordering, _ = case
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    out = hnn.dilated_attention(q, k, v, patterns=patterns, causal=causal, grid=grid, ordering=ordering)
    out.backward(dout)
    return out, q.grad, k.grad, v.grad


def worst(got, want) -> float:
    return float((got.detach().double().cpu() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_outputs_and_gradients_on_the_gpu_match_float64(case, dtype):
    if dtype in (torch.bfloat16, torch.float16) and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the 16-bit kernels need compute capability 8.0")
    tensors = make(shape_of(case), seed=3, dtype=dtype, device="cuda")
    got = run(case, *tensors)
    want = run(case, *(x.cpu().double() for x in tensors))
    for name, g, w in zip(("output", "dq", "dk", "dv"), got, want):
        assert g.device == tensors[0].device and g.dtype == dtype, name
        assert worst(g, w) <= TOLERANCE[dtype], (name, worst(g, w))


def test_gradcheck_float64_on_the_gpu():
    q, k, v = (x.requires_grad_(True) for x in make((4, 16, 2, 3), seed=4, dtype=torch.float64, device="cuda")[:3])
    fn = lambda a, b, c: hnn.dilated_attention(a, b, c, patterns=[(8, 1), (16, 2)], causal=True,  # noqa: E731
                                               grid=(4, 4), ordering="hilbert")
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_float32_head_dims_without_a_fused_kernel_run_the_exact_path():
    case = ((256,), 2, 16, [(64, 1), (256, 4)], True, "natural", None)
    tensors = make(shape_of(case), seed=5, dtype=torch.float32, device="cuda")
    for g, w in zip(run(case, *tensors), run(case, *(x.cpu().double() for x in tensors))):
        assert g.is_cuda and worst(g, w) <= 1e-5


def test_inputs_on_different_devices_are_refused():
    q, k, v = make((16, 2, 4), seed=6, dtype=torch.float32, device="cuda")[:3]
    with pytest.raises(ValueError, match="k: is on cpu, q on cuda:0; q, k and v must be on one device"):
        hnn.dilated_attention(q, k.cpu(), v, patterns=[(8, 1)])


def test_the_module_compiles_to_one_graph_on_the_gpu():
    module = hnn.DilatedAttention(patterns=[(256, 1), (512, 2)], causal=True)
    q, k, v, dout = make((512, 4, 64), seed=7, dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    q.requires_grad_(True)
    out = compiled(q, k, v)
    out.backward(dout)
    ref_q = q.detach().requires_grad_(True)
    module(ref_q, k, v).backward(dout)
    # the forward is deterministic; dQ sums its key blocks' terms by atomicAdd, in any order
    assert torch.equal(out, module(q, k, v)) and worst(q.grad, ref_q.grad.double().cpu()) <= 1e-2


def test_the_numpy_api_computes_cuda_tensors_on_their_gpu():
    from hilbert_hpc import dilated_attention

    q, k, v = make((512, 4, 64), seed=8, dtype=torch.float32, device="cuda")[:3]
    out = dilated_attention(q, k, v, patterns=[(256, 1), (512, 2)], causal=True)
    assert out.is_cuda and torch.equal(out, hnn.dilated_attention(q, k, v, patterns=[(256, 1), (512, 2)],
                                                                    causal=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 96])
def test_an_output_that_a_pattern_merges_at_every_row_is_never_read_before_it_is_written(monkeypatch, dtype, causal, d):
    """The forward's output starts uninitialized where a pattern gives every row a result (the kernels read a
    row's old output only where its log-sum-exp is finite): started as NaN, it ends as it does started at zero,
    bit for bit."""
    from hilbert_hpc.backends import cuda_autograd
    from hilbert_hpc.backends.base import forward_accumulators
    from hilbert_hpc.core.patterns import Pattern, merges_every_row

    patterns = [Pattern(w, r) for w, r in ((512, 2), (256, 1), (1024, 4))]
    q, k, v = make((2048, 5, d), seed=10, dtype=dtype, device="cuda")[:3]
    assert merges_every_row(patterns, 2048)
    results = []
    for fill in (math.nan, 0.0):
        def filled(qs, vs, pats, fill=fill):
            out, lse = forward_accumulators(qs, vs, pats)
            return out.fill_(fill), lse
        monkeypatch.setattr(cuda_autograd, "forward_accumulators", filled)
        results.append(cuda_autograd.forward(q, k, v, patterns, causal, d ** -0.5))
    (out_nan, lse_nan), (out_zero, lse_zero) = results
    assert torch.isfinite(out_nan).all() and torch.equal(out_nan, out_zero) and torch.equal(lse_nan, lse_zero)


def test_16_bit_gradients_in_row_chunks_equal_the_whole_sequence_at_once(monkeypatch):
    """A tiny scratch share makes the 16-bit backward take one lcm of the segments at a time; its gradients
    are those of the whole sequence at once (up to the order of dQ's float32 additions)."""
    from hilbert_hpc.backends import cuda_autograd
    from hilbert_hpc.core.patterns import Pattern

    case = ((2048,), 4, 64, [(256, 1), (512, 2), (1024, 4)], True, "natural", None)
    tensors = make(shape_of(case), seed=9, dtype=torch.bfloat16, device="cuda")
    monkeypatch.setattr(cuda_autograd, "SCRATCH_SHARE", 0.0)
    whole = run(case, *tensors)
    monkeypatch.setattr(cuda_autograd, "SCRATCH_SHARE", 1e-6)
    assert cuda_autograd.chunk_rows(2048, [Pattern(w, r) for w, r in case[3]], 1e-6) == 1024
    chunked = run(case, *tensors)
    assert torch.equal(chunked[0], whole[0])
    for got, want in zip(chunked[1:], whole[1:]):
        assert worst(got, want.double().cpu()) <= 1e-2


def test_16_bit_forward_and_backward_peak_within_1_2_times_the_eight_tensors():
    """Peak GPU memory of a bf16 forward and backward (the package's scratch share) over the bytes of Q, K, V,
    O, dO, dQ, dK, dV: at most 1.2 (the float32 sums of a chunk of rows, L, delta; no copy of dO)."""
    from hilbert_hpc.backends import cuda_autograd

    n, heads, d = 65536, 4, 64
    q, k, v, dout = (torch.randn((n, heads, d), device="cuda").to(torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = hnn.dilated_attention(q, k, v, patterns=[(2048, 1), (4096, 2), (8192, 4)])
    out.backward(dout)
    torch.cuda.synchronize()
    eight = 8 * q.numel() * q.element_size()
    assert cuda_autograd.SCRATCH_SHARE <= 0.1
    assert torch.cuda.max_memory_allocated() <= 1.2 * eight, torch.cuda.max_memory_allocated() / eight
