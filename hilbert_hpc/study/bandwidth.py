"""OSU-style bandwidth sweep of the ring exchange: what a transport can move, without attention.

Every rank sends a message of ``size`` bytes to ``rank + 1`` and receives one
from ``rank - 1`` (the ring's pattern), through the same transport objects the
ring uses; the reported figure is bytes sent per rank / time per exchange (the
slowest rank), the number ring transfers are compared with.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from hilbert_hpc.study.provenance import provenance, utc_now

MIN_BYTES = 1 << 10


def sweep_sizes(max_bytes: int) -> list[int]:
    """Message sizes from 1 KiB doubling up to ``max_bytes``."""
    sizes, s = [], MIN_BYTES
    while s <= max_bytes:
        sizes.append(s)
        s *= 2
    return sizes


def exchange_seconds(comm: Any, transport: Any, send: Any, recv: Any, iterations: int, sync) -> float:
    """Median seconds of one ring exchange (after one warm-up), slowest rank."""
    size = comm.Get_size()
    rank = comm.Get_rank()
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    times = []
    for i in range(iterations + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        transport.start(send, nxt, recv, prv, tag=9).wait()
        sync()
        if i:
            times.append(time.perf_counter() - t0)
    return max(comm.allgather(float(np.median(times))))


def run_bandwidth(comm: Any, transport_name: str, device: str, max_bytes: int, iterations: int,
                  output: str | None = None, overwrite: bool = False) -> list[tuple[int, float]]:
    """Print (rank 0) and return ``[(bytes, GB/s), ...]`` for the chosen transport and memory.

    With ``output``, rank 0 claims the file before the sweep (same rules as
    results files: an existing one only with ``overwrite``) and writes it at the end,
    with the provenance of a results file at its root (docs/results.md, "Bandwidth files").
    """
    from contextlib import ExitStack

    from hilbert_hpc.errors import UserError
    from hilbert_hpc.distributed.mpi import agree
    from hilbert_hpc.study.output_files import NewOutput, hdf5_attr_is

    with ExitStack() as held:
        claim, error = None, None
        if output and comm.Get_rank() == 0:
            try:
                claim = held.enter_context(NewOutput(output, "hilbert-hpc bandwidth file",
                                                     hdf5_attr_is("study", "bandwidth"), overwrite=overwrite))
            except UserError as exc:
                error = exc
        error = agree(comm, error)
        if error is not None:
            raise error
        origin = provenance(comm) if output else {}      # collective: every rank takes part
        rows = _sweep(comm, transport_name, device, max_bytes, iterations)
        if claim is not None:
            settings = {"iterations": iterations, "max_bytes": max_bytes}
            claim.write(lambda h5: _write(h5, rows, origin, settings))
    return [(nbytes, rate) for nbytes, rate, _ in rows]


def _write(f: Any, rows: list[tuple[int, float, dict]], origin: dict[str, Any],
           settings: dict[str, Any]) -> None:
    """The sweep into the open HDF5 file ``f``, with the provenance a results file has at its root."""
    from hilbert_hpc.study.results import hdf5_attr

    for key, value in origin.items():
        f.attrs[key] = hdf5_attr(value)
    f.attrs["program"] = "hilbert-hpc"
    f.attrs["study"] = "bandwidth"
    f.attrs.update(settings)
    f.attrs["finished_utc"] = utc_now()
    ds = f.create_dataset("bandwidth", data=np.asarray([r[:2] for r in rows], dtype=np.float64))
    ds.attrs.update({"columns": "bytes, GB/s", **rows[0][2]} if rows else {"columns": "bytes, GB/s"})


def _sweep(comm: Any, transport_name: str, device: str, max_bytes: int,
           iterations: int) -> list[tuple[int, float, dict]]:
    from hilbert_hpc.distributed.transports import resolve_transport

    on_gpu = device == "gpu"
    if on_gpu:
        import cupy as xp

        from hilbert_hpc.distributed.mpi import bind_gpu

        bind_gpu(comm)

        def sync() -> None:
            xp.cuda.get_current_stream().synchronize()
    else:
        xp = np

        def sync() -> None:
            return None

    transport, reason = resolve_transport(transport_name, on_gpu, comm)
    rows = []
    if comm.Get_rank() == 0:
        print(f"# ring exchange bandwidth, {comm.Get_size()} ranks, {device} buffers, transport "
              f"{transport.name} ({reason})")
        print(f"# {'bytes':>12}  {'GB/s':>10}  {'us':>10}")
    for nbytes in sweep_sizes(max_bytes):
        send = xp.ones(nbytes // 4, dtype=np.float32)
        recv = xp.empty_like(send)
        iters = iterations if nbytes < (64 << 20) else max(3, iterations // 2)
        seconds = exchange_seconds(comm, transport, send, recv, iters, sync)
        attrs = {"transport": transport.name, "reason": reason, "device": device, "ranks": comm.Get_size()}
        rows.append((nbytes, nbytes / seconds / 1e9, attrs))
        if comm.Get_rank() == 0:
            print(f"  {nbytes:>12}  {nbytes / seconds / 1e9:>10.3f}  {seconds * 1e6:>10.1f}", flush=True)
    return rows
