"""The backend contract: what every compute backend is, with the defaults most of them share.

A backend turns serialized (N, H, D) arrays into the serialized output, on one
rank (``serialized_attention``) or around the ring (its ``ring_side``: the
providers of ``attend_fn`` or its fused ``ring_kernels``, and its arrays'
views). Its class also says, without importing CuPy or torch, what it
computes in (``dtypes``), where its arrays live (``on_gpu``), why it cannot run
here (``usable``), what it refuses before any work (``check``), which kernel it
runs for a case (``kernel_choice``), what it holds on a rank (``memory``: its
memory description, ``backends.memory``, which the plan's memory model asks)
and the passes it computes (``passes``; the backward is ``serialized_backward``).
The study code asks these methods and nothing else: adding a backend is one subclass and one line in ``BACKENDS``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hilbert_hpc.backends.memory import BackendMemory
from hilbert_hpc.core.arrays import is_tensor
from hilbert_hpc.core.blockwise import array_module, attend
from hilbert_hpc.core.dilated import AttendFn, empty_accumulators, local_dilated_forward
from hilbert_hpc.core.patterns import Pattern, merges_every_row
from hilbert_hpc.errors import ConfigError

#: what a study case computes (its ``pass`` key): the forward alone, or the forward and then the backward
PASSES = ("forward", "forward+backward")

if TYPE_CHECKING:
    from hilbert_hpc.distributed.providers import BackwardProvider, ForwardProvider
    from hilbert_hpc.kernels.selection import KernelChoice


def _same(x: Any) -> Any:
    """An array as it is."""
    return x


@dataclass(frozen=True)
class RingSide:
    """What a case computes with on several ranks, decided once (:meth:`Backend.ring_side`): the forward and
    backward providers, and how the backend's arrays become what the ring packs and moves (``view``), and how
    the ring's running output (``output``) and float32-or-wider gradients (``gradients``) become the backend's
    arrays of the case's dtype again."""

    forward: ForwardProvider
    #: None: the backend's ring has no backward (its forward+backward cases run on one rank)
    backward: BackwardProvider | None = None
    view: Callable[[Any], Any] = _same
    output: Callable[[Any], Any] = _same
    gradients: Callable[[tuple[Any, Any, Any]], tuple[Any, Any, Any]] = _same


class Backend:
    """The base of every backend; a subclass fills in what differs (class attributes and methods).

    Subclasses must set ``name`` and ``dtypes`` and implement ``to_device``,
    ``to_numpy``, ``synchronize`` and ``serialized_attention``; the other members
    have defaults that fit a backend computing with the array-module algorithm.
    """

    #: the name jobs and the API give
    name: str = ""
    #: the dtypes it computes in (any other is refused when the job is read)
    dtypes: tuple[str, ...] = ()
    #: optional modules it computes with, imported by :meth:`require` (a clear error when missing)
    requires: tuple[str, ...] = ()
    #: True when its arrays live on a GPU (the ring then needs a device transport)
    on_gpu: bool = False
    #: the per-block attention used by the ring, or None for a single-process-only backend
    attend_fn: AttendFn | None = staticmethod(attend)
    #: the passes it computes (of ``PASSES``): "forward+backward" needs :meth:`serialized_backward` (and
    #: :meth:`serialized_forward`, whose default fits every backend)
    passes: tuple[str, ...] = ("forward",)
    #: what it holds on a rank beyond Q, K and V, for the plan's memory model (``study.memory.MemoryModel``)
    memory: BackendMemory = BackendMemory()

    def missing_module(self) -> str | None:
        """Why one of ``requires`` cannot be imported here (the end of a sentence after the backend's name), or
        None: each is imported, so that a module missing, or present and broken, is found."""
        for module in self.requires:
            try:
                importlib.import_module(module)
            except (ImportError, OSError) as exc:
                return f"needs {module}, which cannot be imported here ({exc})"
        return None

    def require(self, param: str = "backend") -> "Backend":
        """This backend with its optional modules imported; a ConfigError names the one missing."""
        missing = self.missing_module()
        if missing:
            raise ConfigError(f"backend {self.name!r} {missing}", param)
        return self

    def usable(self) -> str | None:
        """Why this backend cannot run on this machine (the end of a sentence after its name), or None; by
        default, a module of ``requires`` that does not import (:meth:`missing_module`)."""
        return self.missing_module()

    def for_dtype(self, dtype: str) -> "Backend":
        """The backend that computes cases of ``dtype``: itself, or, for a backend with a side per precision
        (``cuda``: FP32 and 16-bit), that side, chosen once per case (``study.setup.check_case``) so that no
        method of it asks again which precision its arrays are in."""
        return self

    def check(self, head_dim: int, dtype: str, ranks: int) -> KernelChoice | None:
        """Refuse (RuntimeError or ValueError with the reason) what this backend or GPU cannot run, before any
        work; returns the kernel the case will run (:meth:`kernel_choice`)."""
        return self.kernel_choice(head_dim, dtype)

    def kernel_choice(self, head_dim: int, dtype: str, gpu_here: bool = True,
                      cc: int | None = None) -> KernelChoice | None:
        """The kernel this backend runs for ``head_dim`` and ``dtype`` on this GPU (for the launches, the results
        and the memory plan; :func:`hilbert_hpc.kernels.selection.choose`), None for a backend without kernels of
        its own. ``gpu_here=False`` (a plan): the choice the GPU nodes will make, on a GPU of compute capability
        ``cc`` when given (:func:`hilbert_hpc.kernels.selection.planned_choice`; None where they refuse it)."""
        return None

    def ring_kernels(self, kernel: KernelChoice | None) -> ForwardProvider | None:
        """The fused-kernel provider of ``kernel`` (the case's choice) that the ring uses instead of
        ``attend_fn`` + merge (``distributed.ring.HostBlockForward``), or None."""
        return None

    def ring_backward_kernels(self, kernel: KernelChoice | None) -> BackwardProvider | None:
        """The ring backward's block provider (``distributed.ring_backward``; ``kernel``: the case's backward
        kernel choice, :meth:`backward_kernel_choice`), or None for a backend whose ring has no backward: its
        "forward+backward" cases then run on one rank only."""
        return None

    def ring_side(self, dtype: str, kernel: KernelChoice | None = None, backward_kernel: KernelChoice | None = None,
                  backward: bool = False) -> RingSide | None:
        """How a case of ``dtype`` goes around the ring (``kernel``, ``backward_kernel``: the case's choices),
        decided once per case: its forward provider (:meth:`ring_kernels`, else the array-module algorithm
        with ``attend_fn``), with ``backward`` (a forward+backward case) its backward provider
        (:meth:`ring_backward_kernels`), and how its arrays become what the ring moves and back (by default as
        they are). None for a single-process-only backend."""
        forward = self.ring_kernels(kernel)
        if forward is None and self.attend_fn is None:
            return None
        if forward is None:
            from hilbert_hpc.distributed.ring import HostBlockForward

            forward = HostBlockForward(self.attend_fn)
        return RingSide(forward, self.ring_backward_kernels(backward_kernel) if backward else None)

    def to_device(self, x: Any, dtype: Any) -> Any:
        """Move a NumPy array to the backend's array type (and device)."""
        raise NotImplementedError

    def to_numpy(self, x: Any) -> Any:
        """Bring a backend array back to a NumPy array."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until queued device work has finished (for timing)."""
        raise NotImplementedError

    def serialized_attention(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                             scale: float, kernel: KernelChoice | None = None) -> Any:
        """Dilated attention of serialized (N, H, D) arrays -> serialized output (N, H, Dv); ``kernel``: the
        case's kernel choice (None: the backend chooses once for this call)."""
        raise NotImplementedError

    def backward_kernel_choice(self, head_dim: int, dtype: str) -> KernelChoice | None:
        """The backward kernel this backend runs for ``head_dim`` and ``dtype`` on this GPU (the one decision of
        a forward+backward case, ``CaseSetup.backward_kernel``, which :meth:`serialized_backward` takes), None
        for a backend without backward kernels of its own."""
        return None

    def serialized_forward(self, qs: Any, ks: Any, vs: Any, patterns: Sequence[Pattern], causal: bool,
                           scale: float, kernel: KernelChoice | None = None) -> tuple[Any, Any]:
        """The serialized output (N, H, Dv) and its merged log-sum-exp (N, H): the forward of a case with
        ``pass = "forward+backward"``, what :meth:`serialized_backward` starts from.

        The default fits every backend: with fused kernels (:meth:`ring_kernels`),
        their local patterns into an output of the input's type (a 16-bit tensor
        stays 16-bit, as in :meth:`serialized_attention`) and a float32 log-sum-exp;
        otherwise the array-module algorithm with ``attend_fn``.
        """
        kernels = self.ring_kernels(kernel or self.kernel_choice(int(qs.shape[2]), _dtype_name(qs)))
        if kernels is None:
            return local_dilated_forward(qs, ks, vs, patterns, causal, scale, self.attend_fn or attend)
        out, lse = forward_accumulators(qs, vs, patterns)
        kernels.local_patterns(qs, ks, vs, patterns, causal, scale, out, lse)
        return out, lse

    def serialized_backward(self, qs: Any, ks: Any, vs: Any, out: Any, lse: Any, dout: Any,
                            patterns: Sequence[Pattern], causal: bool, scale: float,
                            kernel: KernelChoice | None = None) -> tuple[Any, Any, Any]:
        """The gradients (dQ, dK, dV) of a loss whose gradient in the output is ``dout``: the backward of a case
        with ``pass = "forward+backward"`` (docs/semantics.md, section 10). What a backend provides, with
        "forward+backward" in its ``passes``, is this method (the forward has a default).

        Arguments, all serialized (token order of the shard) and on the backend's
        device, as the study passes them: ``qs``, ``ks``, ``vs`` (N, H, D) and
        ``dout`` (N, H, Dv) as :meth:`to_device` made them in the case's dtype;
        ``out`` (N, H, Dv) and ``lse`` (N, H) as :meth:`serialized_forward`
        returned them (the merged softmax's output and log-sum-exp: P = exp(S - L)
        needs no other state); ``kernel``: the case's kernel choice (None: chosen
        here). None of them may be changed.

        Returns dQ, dK, dV as the backend's arrays (what :meth:`to_numpy` and
        ``arrays.count_nonfinite`` take), shaped like ``qs``, ``ks``, ``vs``, in
        the case's dtype or its accumulator dtype (float32 for 16 bits); rows no
        pattern selects get zeros. The call may return before the device has
        finished: the study times it up to :meth:`synchronize`.
        """
        raise NotImplementedError


def _dtype_name(x: Any) -> str:
    """The dtype name of a backend array (``float32``, ``bfloat16``: torch's without its ``torch.`` prefix)."""
    return str(x.dtype).removeprefix("torch.")


def forward_accumulators(qs: Any, vs: Any, patterns: Sequence[Pattern]) -> tuple[Any, Any]:
    """The running output (N, H, Dv) and -inf log-sum-exp (N, H) that fused kernels merge ``patterns`` into: torch
    tensors on the input's device for a tensor input (the output in its dtype, the log-sum-exp float32), else the
    accumulators of its array module (core.dilated.empty_accumulators). The output starts at zero unless the
    patterns give every row a result (:func:`~hilbert_hpc.core.patterns.merges_every_row`): the kernels read a
    row's old output only where its log-sum-exp is finite, so it is then left uninitialized rather than filled for
    nothing."""
    n, heads, dv = int(qs.shape[0]), int(qs.shape[1]), int(vs.shape[-1])
    zeros = not merges_every_row(patterns, n)
    if not is_tensor(qs):
        return empty_accumulators(array_module(qs), n, heads, dv, qs.dtype, zeros=zeros)
    import torch

    return ((torch.zeros if zeros else torch.empty)((n, heads, dv), dtype=qs.dtype, device=qs.device),
            torch.full((n, heads), float("-inf"), dtype=torch.float32, device=qs.device))


def gpu_unusable() -> str | None:
    """Why CuPy cannot use a GPU here (no CuPy, no driver, no device), or None when one is usable."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except ImportError as exc:
        return f"CuPy is not installed: {exc}"
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError and friends: no driver or no device
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no CUDA driver'}"
    return None if count > 0 else "CUDA sees no device"


class CupyGpuBackend(Backend):
    """A backend computing on CuPy arrays on an NVIDIA GPU: needs CuPy and a usable device."""

    requires = ("cupy",)
    on_gpu = True

    def usable(self) -> str | None:
        """Why CuPy cannot use a GPU here, as "needs an NVIDIA GPU; none is usable here (...)", or None."""
        reason = gpu_unusable()
        return f"needs an NVIDIA GPU; none is usable here ({reason})" if reason else None

    def to_numpy(self, x: Any) -> Any:
        """Copy a device array back to host memory."""
        import cupy

        return cupy.asnumpy(x)

    def synchronize(self) -> None:
        """Wait for the current stream."""
        import cupy

        cupy.cuda.get_current_stream().synchronize()
