"""The PyTorch peer's gradients on CUDA, per SDPA kernel, against float64 on the same (rounded) inputs.

Each kernel's backward op runs per pattern and head offset with the merged output and log-sum-exp; a wrong
merge shows as a dQ/dK error of about 10 % (tests/test_torch_peer.py), far above these tolerances.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hilbert_hpc.backends import torch_peer  # noqa: E402
from hilbert_hpc.core.patterns import Pattern  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for torch")]

#: 48 selected rows per segment and offset: not a multiple of the memory-efficient kernel's 32-row LSE padding
PATTERNS = [Pattern(48, 1), Pattern(96, 2), Pattern(192, 4)]
N, HEADS, D, SCALE = 768, 6, 64, 0.125


def rel(a, b) -> float:
    return float((a.detach().double().cpu() - b.detach()).norm() / b.detach().norm())


def gradients(dtype, causal: bool):
    """(output, dQ, dK, dV) of the CUDA peer in ``dtype`` and of the float64 CPU peer on the same rounded
    inputs and dO (the CPU peer matches the dense reference to 1e-10: tests/test_torch_peer.py)."""
    gen = torch.Generator().manual_seed(11)
    x64 = [torch.randn(N, HEADS, D, generator=gen).to(dtype).double() for _ in range(4)]
    results = []
    for device, dt in (("cuda", dtype), ("cpu", torch.float64)):
        q, k, v = (x.to(device=device, dtype=dt).requires_grad_() for x in x64[:3])
        out = torch_peer.TorchPeer().serialized_attention(q, k, v, PATTERNS, causal, SCALE)
        assert out.dtype == dt and out.device.type == device
        results.append((out, *torch.autograd.grad(out, (q, k, v), x64[3].to(device=device, dtype=dt))))
    return results


@pytest.fixture
def kernel(monkeypatch):
    """Make the peer run a given SDPA kernel (and its backward) for bf16/float16/float32 and head dim 64."""
    def use(kind: str | None) -> None:
        monkeypatch.setattr(torch_peer, "_sdpa_chosen", {})
        if kind is not None:
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                for causal in (False, True):
                    torch_peer._sdpa_chosen[(dtype, D, causal)] = kind
    return use


@pytest.mark.parametrize("causal", [False, True])
def test_float32_gradients_memory_efficient(kernel, causal):
    kernel(None)
    got, want = gradients(torch.float32, causal)
    assert torch_peer.sdpa_kernel(torch.float32, D, causal) == "efficient"
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert rel(g, w) <= 1e-4, name


@pytest.mark.parametrize("kind", ["cudnn", "flash", "efficient"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_16_bit_gradients_per_kernel(kernel, kind, dtype, causal):
    kernel(kind)
    got, want = gradients(dtype, causal)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 4e-3
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert g.dtype == dtype and rel(g, w) <= tolerance, name


def test_16_bit_default_kernel_is_differentiable(kernel):
    """Whatever kernel the order picks on this GPU (cuDNN on Hopper), its backward takes the merged state."""
    kernel(None)
    got, want = gradients(torch.bfloat16, True)
    assert torch_peer.sdpa_kernel(torch.bfloat16, D, True) in ("cudnn", "flash", "efficient")
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert rel(g, w) <= 2e-2, name
