"""The PyTorch peer runs the fastest SDPA kernel that returns the log-sum-exp, chosen once per kind of call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from hilbert_hpc.backends import torch_peer  # noqa: E402


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


def test_the_peer_refuses_inputs_that_need_gradients():
    """Autograd through SDPA drops the log-sum-exp's gradient, so merged patterns would get wrong dQ and dK."""
    from hilbert_hpc.backends.torch_peer import TorchPeer
    from hilbert_hpc.core.patterns import Pattern

    q = torch.randn(64, 2, 8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(NotImplementedError, match="not differentiable"):
        TorchPeer().serialized_attention(q, q, q, [Pattern(16, 1), Pattern(32, 2)], False, 0.3)
    with torch.no_grad():
        out = TorchPeer().serialized_attention(q, q, q, [Pattern(16, 1), Pattern(32, 2)], False, 0.3)
    assert out.shape == (64, 2, 8)
