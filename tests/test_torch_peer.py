"""The PyTorch peer runs the fastest SDPA kernel that returns the log-sum-exp, chosen once per kind of call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from hilbert_hpc.backends import gather_merge, torch_peer  # noqa: E402


def fake_cuda(element_size: int, head_dim: int = 64) -> SimpleNamespace:
    """Enough of a CUDA tensor for the choice: its dtype, shape, element size and device."""
    return SimpleNamespace(is_cuda=True, dtype=f"e{element_size}", shape=(1, 2, 8, head_dim),
                           element_size=lambda: element_size)


@pytest.fixture
def calls(monkeypatch):
    """The kernels tried, in order; cuDNN refuses head dim 96 (as it may on some GPUs)."""
    tried = []
    monkeypatch.setattr(torch_peer, "_sdpa_chosen", {})

    def sdpa(kind, q, k, v, causal, scale):
        tried.append(kind)
        if kind == "cudnn" and q.shape[-1] == 96:
            raise RuntimeError("cuDNN SDPA does not support this head dim")
        return kind, None

    monkeypatch.setattr(torch_peer, "_sdpa", sdpa)
    return tried


def test_16_bit_runs_cudnn_first_and_keeps_the_choice(calls):
    q = fake_cuda(2)
    assert torch_peer.sdpa_with_lse(q, q, q, False, 1.0)[0] == "cudnn"
    assert torch_peer.sdpa_with_lse(q, q, q, False, 1.0)[0] == "cudnn"
    assert calls == ["cudnn", "cudnn"] and torch_peer.sdpa_kernel("e2", 64, False) == "cudnn"


def test_a_kernel_that_refuses_the_tensors_falls_back_to_the_next_once(calls):
    q = fake_cuda(2, head_dim=96)
    assert torch_peer.sdpa_with_lse(q, q, q, True, 1.0)[0] == "flash"
    assert torch_peer.sdpa_with_lse(q, q, q, True, 1.0)[0] == "flash"
    assert calls == ["cudnn", "flash", "flash"]


def test_float32_has_only_the_memory_efficient_kernel(calls):
    q = fake_cuda(4)
    assert torch_peer.sdpa_with_lse(q, q, q, False, 1.0)[0] == "efficient"
    assert calls == ["efficient"]


def test_out_of_memory_is_not_taken_for_a_refusal(monkeypatch):
    monkeypatch.setattr(torch_peer, "_sdpa_chosen", {})

    def sdpa(kind, *args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch_peer, "_sdpa", sdpa)
    q = fake_cuda(2)
    with pytest.raises(torch.OutOfMemoryError):
        torch_peer.sdpa_with_lse(q, q, q, False, 1.0)


def test_cpu_log_sum_exp_is_the_softmax_normaliser():
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=torch.float64) for _ in range(3))
    out, lse = torch_peer.sdpa_with_lse(q, k, v, True, 0.3)
    s = (q @ k.transpose(-1, -2)) * 0.3
    s = s.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-12)
    assert torch.allclose(out, torch.softmax(s, -1) @ v, atol=1e-12)


#: (patterns, causal, heads): keys shared by patterns, causal, dilations > 1 with heads not divisible by r,
#: and a dilation above the head count
GRADIENT_CASES = [
    ([(16, 1), (32, 2), (64, 4)], True, 3),
    ([(16, 1), (16, 2)], False, 5),
    ([(8, 1), (32, 4), (64, 8)], True, 6),
    ([(32, 2), (64, 8)], False, 3),
    ([(32, 1)], False, 2),
]


def peer_and_dense_gradients(patterns, causal, heads, n=128, d=8, scale=0.3):
    """(gradients of the peer, of plain autograd through its merge, of the dense reference) for one dO."""
    from dense_reference import dense_dilated_attention_torch

    from hilbert_hpc.core.patterns import Pattern

    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, heads, d, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    dout = torch.randn(n, heads, d, dtype=torch.float64, generator=gen)
    pats = [Pattern(*p) for p in patterns]
    peer = torch_peer.TorchPeer().serialized_attention(q, k, v, pats, causal, scale)
    naive, _ = gather_merge.merged_attention(torch_peer.SDPA, q, k, v, pats, causal, scale)  # autograd through both
    dense = dense_dilated_attention_torch(q, k, v, patterns, causal, scale=scale)
    return tuple(torch.autograd.grad(out, (q, k, v), dout) for out in (peer, naive, dense))


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("patterns, causal, heads", GRADIENT_CASES)
def test_peer_gradients_match_the_dense_reference(patterns, causal, heads):
    peer, _, dense = peer_and_dense_gradients(patterns, causal, heads)
    for name, got, want in zip("qkv", peer, dense):
        assert rel(got, want) <= 1e-10, f"d{name}"


def test_plain_autograd_through_the_merge_is_wrong_where_patterns_merge():
    """What the peer's Function replaces: SDPA's backward drops its log-sum-exp's gradient, so dQ and dK come out
    wrong (dV is right: it does not depend on the log-sum-exp)."""
    _, naive, dense = peer_and_dense_gradients(*GRADIENT_CASES[0])
    assert rel(naive[0], dense[0]) > 1e-2 and rel(naive[1], dense[1]) > 1e-2
    assert rel(naive[2], dense[2]) <= 1e-10


def test_gradcheck_of_the_peer():
    from hilbert_hpc.core.patterns import Pattern

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(32, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    pats = [Pattern(8, 1), Pattern(16, 2), Pattern(32, 4)]
    assert torch.autograd.gradcheck(
        lambda q, k, v: torch_peer.TorchPeer().serialized_attention(q, k, v, pats, True, 0.5), (q, k, v))


def test_the_forward_keeps_nothing_without_gradients():
    from hilbert_hpc.core.patterns import Pattern

    q = torch.randn(64, 2, 8, dtype=torch.float64, requires_grad=True)
    pats = [Pattern(16, 1), Pattern(32, 2)]
    with torch.no_grad():
        out = torch_peer.TorchPeer().serialized_attention(q, q, q, pats, False, 0.3)
    assert out.grad_fn is None
    assert torch_peer.TorchPeer().serialized_attention(q.detach(), q.detach(), q.detach(), pats, False,
                                                       0.3).grad_fn is None
    with_grad = torch_peer.TorchPeer().serialized_attention(q, q, q, pats, False, 0.3)
    assert with_grad.grad_fn is not None and torch.equal(with_grad.detach(), out)


def test_bfloat16_gradients_on_the_cpu_are_rounded_once():
    """16-bit CPU inputs: the flash CPU backward per pattern, accumulated in FP32; close to float64."""
    from hilbert_hpc.core.patterns import Pattern

    gen = torch.Generator().manual_seed(5)
    x64 = [torch.randn(128, 3, 16, generator=gen).bfloat16().double() for _ in range(4)]    # the same inputs
    pats = [Pattern(16, 1), Pattern(32, 2), Pattern(64, 4)]
    grads = []
    for dtype in (torch.bfloat16, torch.float64):
        q, k, v = (x.to(dtype).requires_grad_() for x in x64[:3])
        out = torch_peer.TorchPeer().serialized_attention(q, k, v, pats, True, 0.25)
        assert out.dtype == dtype
        grads.append(torch.autograd.grad(out, (q, k, v), x64[3].to(dtype)))
    for got, want in zip(*grads):
        assert got.dtype == torch.bfloat16 and rel(got.double(), want) < 3e-2


@pytest.mark.parametrize("causal", [False, True])
def test_the_math_kernel_of_float64_on_cuda_equals_the_cpu_kernel(causal):
    """float64 has no SDPA kernel on CUDA: the peer's ``math`` kernel (plain products) stands in; on the CPU it
    gives what the CPU flash kernel gives, forward and backward with a given log-sum-exp."""
    gen = torch.Generator().manual_seed(9)
    q, k, v, dout = (torch.randn((2, 3, 40, 8), generator=gen, dtype=torch.float64) for _ in range(4))
    math_out, math_lse = torch_peer._sdpa("math", q, k, v, causal, 0.3)
    cpu_out, cpu_lse = torch_peer._sdpa("cpu", q, k, v, causal, 0.3)
    assert torch.allclose(math_out, cpu_out, atol=1e-13) and torch.allclose(math_lse, cpu_lse, atol=1e-13)
    for a, b in zip(torch_peer._sdpa_backward("math", dout, q, k, v, cpu_out, cpu_lse, causal, 0.3),
                    torch_peer._sdpa_backward("cpu", dout, q, k, v, cpu_out, cpu_lse, causal, 0.3)):
        assert torch.allclose(a, b, atol=1e-13)
