"""The gather/merge of the peers with a kernel in FlashAttention-4's (B, L, H, D) layout, and the flash peer's
refusals, on the CPU (FlashAttention-4 itself runs in tests/test_flash_peer_gpu.py)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from hilbert_hpc.backends import find_backend, flash_peer, gather_merge, require_usable, torch_peer  # noqa: E402
from hilbert_hpc.core.patterns import Pattern  # noqa: E402
from hilbert_hpc.errors import ConfigError  # noqa: E402

from test_torch_peer import GRADIENT_CASES  # noqa: E402


def rel(a, b) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


class RowsFirstSdpa:
    """A kernel in FlashAttention-4's layout, (batch, rows, heads, D), on the CPU SDPA kernel; it records the
    shapes it is given and checks that they are contiguous, as FlashAttention-4 gets them."""

    heads_first = False

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def _heads_first(self, *xs):
        for x in xs:
            assert x.is_contiguous()
        self.shapes.append(tuple(xs[0].shape))
        return [x.transpose(1, 2) for x in xs]

    def forward(self, q, k, v, causal, scale):
        out, lse = torch_peer.SDPA.forward(*self._heads_first(q, k, v), causal, scale)
        return out.transpose(1, 2), lse

    def backward(self, dout, q, k, v, out, lse, causal, scale):
        grads = torch_peer.SDPA.backward(*self._heads_first(dout, q, k, v, out), lse, causal, scale)
        return tuple(g.transpose(1, 2) for g in grads)


def gradients(kernel, patterns, causal, heads, n=128, d=8, scale=0.3):
    """(output, dQ, dK, dV) of the peers' merge with ``kernel`` and of the dense reference, float64."""
    from dense_reference import dense_dilated_attention_torch

    gen = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(n, heads, d, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    dout = torch.randn(n, heads, d, dtype=torch.float64, generator=gen)
    got = gather_merge.peer_attention(kernel, q, k, v, [Pattern(*p) for p in patterns], causal, scale)
    want = dense_dilated_attention_torch(q, k, v, patterns, causal, scale=scale)
    return [(out, *torch.autograd.grad(out, (q, k, v), dout)) for out in (got, want)]


@pytest.mark.parametrize("patterns, causal, heads", GRADIENT_CASES)
def test_rows_first_kernel_matches_the_dense_reference(patterns, causal, heads):
    kernel = RowsFirstSdpa()
    got, want = gradients(kernel, patterns, causal, heads)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert rel(g, w) <= 1e-10, name
    # (segments, selected rows, heads of the offset, D): no permute to heads first (offset 0 of the first pattern)
    w, r = patterns[0]
    assert kernel.shapes[0] == (128 // w, w // r, len(range(0, heads, r)), 8)


def test_both_layouts_give_the_same_numbers():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(256, 5, 16, dtype=torch.float64, generator=gen) for _ in range(3))
    pats = [Pattern(32, 1), Pattern(64, 2), Pattern(256, 8)]
    for causal in (False, True):
        a, lse_a = gather_merge.merged_attention(torch_peer.SDPA, q, k, v, pats, causal, 0.25)
        b, lse_b = gather_merge.merged_attention(RowsFirstSdpa(), q, k, v, pats, causal, 0.25)
        assert torch.allclose(a, b, rtol=0, atol=1e-13) and torch.allclose(lse_a, lse_b, rtol=0, atol=1e-13)


def test_the_flash_peer_runs_its_kernel_through_the_merge(monkeypatch):
    """FlashPeer.serialized_attention is the gather/merge with its ``attention`` kernel (here the stand-in)."""
    kernel = RowsFirstSdpa()
    monkeypatch.setattr(flash_peer.FlashPeer, "attention", kernel)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(64, 3, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    pats = [Pattern(16, 1), Pattern(64, 4)]
    got = flash_peer.FlashPeer().serialized_attention(q, k, v, pats, True, 0.5)
    assert kernel.shapes and got.grad_fn is not None
    want = torch_peer.TorchPeer().serialized_attention(q, k, v, pats, True, 0.5)
    assert torch.allclose(got, want, rtol=0, atol=1e-13)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_peer.FlashPeer().serialized_attention(q, k, v, pats, True, 0.5), (q, k, v))


@pytest.fixture
def machine(monkeypatch):
    """Set what the flash peer sees: a CUDA device or not, FlashAttention-4 importable or not, the GPU's cc."""
    def set_machine(cuda: bool, fa4: bool, cc: tuple[int, int] = (9, 0)) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cc)
        monkeypatch.setitem(__import__("sys").modules, flash_peer.FA4_MODULE,
                            types.ModuleType(flash_peer.FA4_MODULE) if fa4 else None)
    return set_machine


def test_without_cuda_the_flash_peer_is_unusable(machine):
    machine(cuda=False, fa4=True)
    assert find_backend("flash").usable() == "needs a CUDA GPU of compute capability 9.0 or newer; torch sees none"
    with pytest.raises(ConfigError, match=r"^cases\[0\]\.backend: backend 'flash' needs a CUDA GPU of compute"):
        require_usable("flash", "cases[0].backend")


def test_without_flash_attention_4_the_flash_peer_says_how_to_install_it(machine):
    machine(cuda=True, fa4=False)
    reason = find_backend("flash").usable()
    assert reason.startswith("needs FlashAttention-4 (pip install 'hilbert_hpc[flash]'): flash_attn.cute is not")
    with pytest.raises(ConfigError, match=r"backend 'flash' needs FlashAttention-4 \(pip install") as err:
        require_usable("flash")
    assert "\n" not in str(err.value)


def test_below_compute_capability_9_the_flash_peer_is_unusable(machine):
    machine(cuda=True, fa4=True, cc=(8, 0))
    assert find_backend("flash").usable() == ("needs a GPU of compute capability 9.0 or newer "
                                              "(FlashAttention-4's backward); this one is 8.0")
    machine(cuda=True, fa4=True, cc=(9, 0))
    assert require_usable("flash").usable() is None


def test_the_flash_peer_is_a_16_bit_gpu_peer_on_one_process():
    be = find_backend("flash")
    assert be.dtypes == ("bfloat16", "float16") and be.on_gpu and be.memory.counted_on_gpu(be, None)
    assert be.attend_fn is None and be.attention is flash_peer.FA4
    for head_dim in (8, 64, 96, 128, 256):
        assert be.check(head_dim, "bfloat16", 1) is None
    for head_dim in (4, 100, 264):
        with pytest.raises(ValueError, match=f"takes head_dim 8 to 256 in multiples of 8, not {head_dim}$"):
            be.check(head_dim, "bfloat16", 1)
