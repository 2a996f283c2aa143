"""Every provider answers every call of its protocol, with the protocol's parameters (a provider missing one
would fail only on the GPU, where the CPU suite cannot see it)."""

from __future__ import annotations

import inspect

import pytest

from hilbert_hpc.distributed.providers import BackwardProvider, ForwardProvider
from hilbert_hpc.distributed.ring import HostBlockForward
from hilbert_hpc.distributed.ring_backward import HostBlockBackward
from hilbert_hpc.kernels.backward import RingBackwardKernels
from hilbert_hpc.kernels.launch import FusedKernels
from hilbert_hpc.kernels.sixteen_bit import SixteenBitKernels


def _members(protocol: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(protocol).items()
            if callable(fn) and not name.startswith("_")}


@pytest.mark.parametrize("protocol,provider", [
    (ForwardProvider, HostBlockForward), (ForwardProvider, FusedKernels), (ForwardProvider, SixteenBitKernels),
    (BackwardProvider, HostBlockBackward), (BackwardProvider, RingBackwardKernels)])
def test_a_provider_has_every_member_of_its_protocol(protocol, provider):
    for name, wanted in _members(protocol).items():
        assert callable(getattr(provider, name, None)), f"{provider.__name__} has no {name}"
        got = inspect.signature(getattr(provider, name))
        assert list(got.parameters)[:len(wanted.parameters)] == list(wanted.parameters), (provider.__name__, name)


def test_a_ring_side_is_decided_once_per_case():
    """numpy: the array-module providers and its arrays as they are; the torch peer: no ring; cuda: the 16-bit
    side moves bits and rounds once, the float32 side moves the arrays as they are."""
    from hilbert_hpc.backends import find_backend
    from hilbert_hpc.backends.cuda_fused import _as_tensor, _bits, _rounded
    from hilbert_hpc.kernels.selection import planned_choice

    side = find_backend("numpy").ring_side("float64", backward=True)
    assert isinstance(side.forward, HostBlockForward) and isinstance(side.backward, HostBlockBackward)
    assert side.view("x") == "x" and side.output("o") == "o" and side.gradients(("g",)) == ("g",)
    assert find_backend("numpy").ring_side("float64").backward is None          # a forward-only case
    assert find_backend("torch").ring_side("bfloat16") is None
    cuda = find_backend("cuda")
    bf16 = cuda.ring_side("bfloat16", planned_choice("bfloat16", 64, 90), None)
    assert isinstance(bf16.forward, SixteenBitKernels) and bf16.view is _bits
    assert bf16.output.func is _as_tensor and bf16.gradients.func is _rounded
    assert bf16.output.keywords == {"dtype": "bfloat16"}
    fp32 = cuda.ring_side("float32", planned_choice("float32", 64, 90), None)
    assert isinstance(fp32.forward, FusedKernels) and fp32.view("x") == "x"


def test_backend_cuda_takes_its_side_once_per_case():
    """Backend cuda has an FP32 side and a 16-bit side: a case takes its side once (``for_dtype``; the study's
    setup keeps it), whose methods never ask which precision they compute in; the backend itself hands each call
    to the side of the call's dtype or arrays (a torch tensor is 16-bit), with the same answers as the side."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from hilbert_hpc.backends import find_backend
    from hilbert_hpc.backends.cuda_fused import CudaFp32Side, CudaSixteenBit
    from hilbert_hpc.kernels.selection import planned_choice
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.setup import plan_setup

    cuda = find_backend("cuda")
    for dtype, side in (("float32", CudaFp32Side), ("bfloat16", CudaSixteenBit), ("float16", CudaSixteenBit)):
        chosen = cuda.for_dtype(dtype)
        assert type(chosen) is side and chosen.name == "cuda" and dtype in chosen.dtypes
        assert chosen.memory is not None and chosen.for_dtype(dtype) is chosen
        assert (cuda.kernel_choice(64, dtype, gpu_here=False, cc=90)
                == chosen.kernel_choice(64, dtype, gpu_here=False, cc=90) == planned_choice(dtype, 64, 90))
    assert type(cuda._side_of(torch.zeros(2, dtype=torch.bfloat16))) is CudaSixteenBit
    assert type(cuda._side_of(np.zeros(2, dtype=np.float32))) is CudaFp32Side
    assert np.array_equal(cuda.to_numpy(torch.tensor([1.5, -2.0], dtype=torch.bfloat16)), [1.5, -2.0])
    assert find_backend("numpy").for_dtype("float64").name == "numpy"

    job = load_job("sides.toml", '[job]\nname = "sides"\noutput = "x.h5"\n[[cases]]\nname = "c"\nbackend = "cuda"\n'
                                 'dtype = "bfloat16"\ngrid = [64, 64]\nheads = 2\nhead_dim = 64\n'
                                 'patterns = [[256, 1]]\n')
    assert type(plan_setup(job.cases[0]).backend) is CudaSixteenBit
