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
