"""How K/V blocks move between ranks: host, cuda-aware and staged transports (docs/distributed.md, "Transports").

A transport starts one non-blocking exchange (send one buffer to a rank, receive
another from a rank: ``start``; or any number of each, all posted together:
``start_many``) and later waits for it:

``host``        NumPy arrays straight to mpi4py ``Isend``/``Irecv``.
``cuda-aware``  CuPy device arrays straight to mpi4py (the stream is synchronized
                first). Only with an MPI library built with CUDA support: a
                non-CUDA-aware library given a device pointer crashes.
``staged``      Device -> pinned host (chunked, on a copy stream) -> MPI -> pinned
                host -> device, without blocking the caller: each chunk's send
                starts as soon as its copy has landed and each received chunk is
                copied up as soon as it has arrived, while the GPU computes.
``auto``        ``cuda-aware`` when it is known to work (see :mod:`hilbert_hpc.distributed.cuda_aware`),
                else ``staged``; ``host`` for NumPy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hilbert_hpc.errors import ConfigError

TRANSPORTS = ("auto", "cuda-aware", "staged", "host")

#: Bytes per chunk of a staged transfer.
STAGED_CHUNK_BYTES = 4 << 20


class Exchange:
    """One posted send/receive pair; ``wait()`` completes both."""

    def __init__(self, requests: list) -> None:
        self.requests = requests

    def test(self) -> bool:
        """Drive MPI progress without blocking; True once the posted requests have completed."""
        from mpi4py import MPI

        return bool(MPI.Request.Testall(self.requests)) if self.requests else True

    def wait(self) -> None:
        """Block until the send has left and the received block is usable."""
        from mpi4py import MPI

        MPI.Request.Waitall(self.requests)


class HostTransport:
    """Buffers handed to mpi4py as they are (host arrays, or device arrays with a CUDA-aware MPI)."""

    name = "host"

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def prepare(self, send: Any) -> None:
        """Nothing to do before posting host buffers."""

    def start(self, send: Any | None, dest: int, recv: Any | None, source: int, tag: int) -> Exchange:
        """Post ``Irecv(recv <- source)`` and ``Isend(send -> dest)``; ``None`` skips a side."""
        return self.start_many([(send, dest)], [(recv, source)], tag)

    def start_many(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]], tag: int) -> Exchange:
        """Post every ``Irecv(buffer <- source)`` of ``recvs``, then every ``Isend(buffer -> dest)`` of ``sends``
        (one buffer may go to several ranks); ``None`` or empty buffers are skipped."""
        sends = [(b, d) for b, d in sends if b is not None and b.size]
        if sends:
            self.prepare(sends[0][0])
        reqs = [self.comm.Irecv(b, source=src, tag=tag) for b, src in recvs if b is not None and b.size]
        reqs += [self.comm.Isend(b, dest=d, tag=tag) for b, d in sends]
        return Exchange(reqs)


class CudaAwareTransport(HostTransport):
    """CuPy arrays straight to a CUDA-aware MPI; the compute stream is synchronized before sending."""

    name = "cuda-aware"

    def prepare(self, send: Any) -> None:
        """Make sure the block to send has been written by the GPU."""
        import cupy

        cupy.cuda.get_current_stream().synchronize()


class StagedTransport:
    """Device blocks through pinned host buffers, chunked so that copies overlap the MPI transfer and compute.

    ``start`` returns at once: the copy stream waits (on the GPU) for the compute
    stream's work so far, then copies the block down chunk by chunk. Each chunk's
    ``Isend`` is posted as soon as its copy has landed and each received chunk is
    copied up as soon as it has arrived, whenever the exchange is driven
    (``test`` during compute, then ``wait``). The pinned buffers are allocated
    once per role, dtype and tag and reused (grown only for a larger block): exchanges of different tags may
    be in flight at the same time, one exchange per tag.
    """

    name = "staged"

    def __init__(self, comm: Any, chunk_bytes: int = STAGED_CHUNK_BYTES) -> None:
        import cupy

        self.comm = comm
        self.cupy = cupy
        self.chunk_bytes = chunk_bytes
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)
        self._pinned: dict[tuple[str, str], np.ndarray] = {}

    def _host(self, role: str, like: Any, tag: int, size: int) -> np.ndarray:
        """Pinned host buffer (reused, grown on demand) of ``size`` elements of the dtype of ``like``; one per
        role and tag, so exchanges of different tags may be in flight together."""
        key = (role, like.dtype.str, tag)
        buf = self._pinned.get(key)
        if buf is None or buf.size < size:
            mem = self.cupy.cuda.alloc_pinned_memory(size * like.dtype.itemsize)
            buf = np.frombuffer(mem, dtype=like.dtype, count=size)
            self._pinned[key] = buf
        return buf[:size]

    def _chunks(self, n: int, itemsize: int) -> list[slice]:
        step = max(1, self.chunk_bytes // itemsize)
        return [slice(i, min(n, i + step)) for i in range(0, n, step)]

    def start(self, send: Any | None, dest: int, recv: Any | None, source: int, tag: int) -> "StagedExchange":
        """Post the receive and queue the chunked copy of ``send`` to pinned memory; returns at once."""
        return self.start_many([(send, dest)], [(recv, source)], tag)

    def start_many(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]],
                   tag: int) -> "StagedExchange":
        """Post the receives of ``recvs`` and queue the chunked copies of the buffers of ``sends`` to pinned
        memory (a buffer going to several ranks is copied once); returns at once."""
        cp = self.cupy
        exchange = StagedExchange(self)
        recvs = [(b, src) for b, src in recvs if b is not None and b.size]
        sends = [(b, d) for b, d in sends if b is not None and b.size]
        if recvs:
            host_in = self._host("recv", recvs[0][0], tag, sum(b.size for b, _ in recvs))
            at = 0
            for recv, source in recvs:
                flat_in, pinned = recv.reshape(-1), host_in[at:at + recv.size]
                at += recv.size
                for sl in self._chunks(recv.size, recv.dtype.itemsize):
                    exchange.incoming.append((self.comm.Irecv(pinned[sl], source=source, tag=tag), flat_in[sl],
                                              pinned[sl]))
        distinct: dict[tuple[int, int], tuple[Any, list[int]]] = {}
        for send, dest in sends:                   # one copy of a buffer that goes to several ranks
            distinct.setdefault((send.data.ptr, send.size), (send, []))[1].append(dest)
        if distinct:
            host_out = self._host("send", sends[0][0], tag, sum(b.size for b, _ in distinct.values()))
            self.copy_stream.wait_event(cp.cuda.get_current_stream().record())   # the blocks are written
            at = 0
            for send, dests in distinct.values():
                flat, pinned = send.reshape(-1), host_out[at:at + send.size]
                at += send.size
                for sl in self._chunks(send.size, send.dtype.itemsize):
                    flat[sl].get(out=pinned[sl], stream=self.copy_stream, blocking=False)
                    event = self.copy_stream.record()
                    exchange.outgoing.extend((event, pinned[sl], dest, tag) for dest in dests)
        exchange.test()
        return exchange


class StagedExchange(Exchange):
    """A staged send/receive pair in flight: chunks move on as their copies or messages complete."""

    def __init__(self, transport: StagedTransport) -> None:
        super().__init__([])
        self.transport = transport
        self.outgoing: list[tuple[Any, np.ndarray, int, int]] = []    # (copy-down event, pinned chunk, dest, tag)
        self.incoming: list[tuple[Any, Any, np.ndarray]] = []          # (receive request, device chunk, pinned)

    def _advance(self, block: bool) -> None:
        comm, stream = self.transport.comm, self.transport.copy_stream
        while self.outgoing and (block or self.outgoing[0][0].done):
            event, chunk, dest, tag = self.outgoing.pop(0)
            event.synchronize()
            self.requests.append(comm.Isend(chunk, dest=dest, tag=tag))
        while self.incoming and (block or self.incoming[0][0].Test()):
            req, device_chunk, host_chunk = self.incoming.pop(0)
            req.Wait()
            device_chunk.set(host_chunk, stream=stream)

    def test(self) -> bool:
        """Post the sends of chunks that have landed, copy up chunks that have arrived; True when all is done."""
        from mpi4py import MPI

        self._advance(block=False)
        return not self.outgoing and not self.incoming and (
            bool(MPI.Request.Testall(self.requests)) if self.requests else True)

    def wait(self) -> None:
        """Finish every chunk; the received block is on the device and the pinned buffers are free again."""
        from mpi4py import MPI

        self._advance(block=True)
        self.transport.copy_stream.synchronize()
        MPI.Request.Waitall(self.requests)


@dataclass(frozen=True)
class TransportChoice:
    """Which transport a case's ring uses and why, decided once before any work (no communicator needed)."""

    #: host, cuda-aware or staged
    name: str
    #: the sentence the results record as ``transport_reason``
    reason: str
    #: (known to work, evidence) of the MPI library's CUDA-awareness where it was asked (device arrays, auto or
    #: cuda-aware); None otherwise
    cuda_aware: tuple[bool, str] | None = None


def choose_transport(name: str, on_gpu: bool) -> TransportChoice:
    """The transport for ``name`` (``TRANSPORTS``) and arrays on a GPU or not, with the reason; the MPI
    library's CUDA-awareness (:func:`~hilbert_hpc.distributed.cuda_aware.cuda_aware_support`) is asked here only."""
    if name not in TRANSPORTS:
        raise ConfigError(f"unknown transport {name!r}; choose one of {', '.join(TRANSPORTS)}", "transport")
    if not on_gpu:
        if name in ("cuda-aware", "staged"):
            return TransportChoice("host", f"{name} requested, but the arrays are host (NumPy) arrays: host transport")
        return TransportChoice("host", "host arrays: plain MPI on host memory")
    if name == "staged":
        return TransportChoice("staged", "staged requested")
    if name == "host":
        raise ConfigError("transport 'host' cannot move device arrays; use staged or cuda-aware", "transport")
    from hilbert_hpc.distributed.cuda_aware import cuda_aware_support

    known, why = cuda_aware_support()
    if name == "cuda-aware":
        return TransportChoice("cuda-aware", f"cuda-aware requested ({why})", (known, why))
    if known:
        return TransportChoice("cuda-aware", f"auto: cuda-aware ({why})", (known, why))
    return TransportChoice("staged", f"auto: staged ({why})", (known, why))


def open_transport(choice: TransportChoice, comm: Any) -> Any:
    """The transport object of ``choice`` on ``comm``."""
    kinds = {"host": HostTransport, "cuda-aware": CudaAwareTransport, "staged": StagedTransport}
    return kinds[choice.name](comm)


def resolve_transport(name: str, on_gpu: bool, comm: Any) -> tuple[Any, str]:
    """The transport object for ``name`` on ``comm`` and a sentence saying why it was chosen."""
    choice = choose_transport(name, on_gpu)
    return open_transport(choice, comm), choice.reason
