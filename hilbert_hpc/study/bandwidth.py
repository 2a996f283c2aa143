"""OSU-style bandwidth sweep of the ring exchange: what a transport can move, without attention, and its latency.

Every rank sends a message of ``size`` bytes to ``rank + 1`` and receives one
from ``rank - 1`` (the ring's pattern), through the same transport objects the
ring uses; the reported figure is bytes sent per rank / time per exchange (the
slowest rank), the number ring transfers are compared with. A few small
messages (``LATENCY_BYTES``) are timed first, and the times of every size fit
``t(bytes) = alpha + bytes / B`` (:func:`fit_latency`): the latency ``alpha``
and bandwidth ``B`` that ``plan --project --from`` reads (:func:`read_link`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hilbert_hpc.study.provenance import provenance, utc_now

MIN_BYTES = 1 << 10
#: the small messages timed before the sweep: their exchange is the latency
LATENCY_BYTES = (8, 64, 512)
#: units of the fit's attributes of the ``bandwidth`` dataset (stored as JSON in its ``units``)
FIT_UNITS = {"alpha_s": "s", "b_gb_per_s": "GB/s"}


@dataclass(frozen=True)
class LatencyFit:
    """``t(bytes) = alpha + bytes / B`` of one exchange, and how it was found."""

    alpha_s: float
    gb_per_s: float
    #: "least squares", or what stood in where the times left a term non-positive
    method: str

    def seconds(self, nbytes: float) -> float:
        """The time of one exchange of ``nbytes`` bytes."""
        return self.alpha_s + nbytes / (self.gb_per_s * 1e9)


def fit_latency(nbytes: Sequence[float], seconds: Sequence[float]) -> LatencyFit:
    """``alpha`` (s) and ``B`` (GB/s) of ``t = alpha + bytes / B`` over measured ``(bytes, seconds)``: least
    squares on the relative residuals (each size weighs alike, small or large). Both come out positive: where
    noise leaves ``alpha`` at or below 0, the smallest message's time stands in (and ``1 / B`` is fitted
    again with it); where ``1 / B`` is at or below 0 (times that do not grow with the size), the highest rate
    measured, bytes / t, stands in for ``B``."""
    x = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if x.size < 2 or x.size != t.size or not (t > 0).all() or not (x > 0).all():
        raise ValueError(f"a latency fit needs two or more positive (bytes, seconds), got {list(zip(x, t))}")
    w = 1.0 / t
    (alpha, inverse), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), np.ones_like(t), rcond=None)
    method = "least squares"
    if not alpha > 0:
        alpha = float(t[np.argmin(x)])
        inverse = float(np.sum(w * w * x * (t - alpha)) / np.sum(w * w * x * x))
        method = "alpha: the smallest message's time (the fit's was not positive)"
    if not inverse > 0:
        inverse = float(np.min(t / x))
        method += "; B: the highest rate measured (the times do not grow with the size)"
    return LatencyFit(float(alpha), 1e-9 / float(inverse), method)


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


@dataclass
class Sweep:
    """What one ``bandwidth`` run measured: ``(bytes, seconds)`` of the small messages and of the sweep, the
    transport's attributes, and the fit over both."""

    latency: list[tuple[int, float]]
    sizes: list[tuple[int, float]]
    attrs: dict[str, Any]
    fit: LatencyFit

    @property
    def rates(self) -> list[tuple[int, float]]:
        """``(bytes, GB/s)`` of the sweep."""
        return [(nbytes, nbytes / seconds / 1e9) for nbytes, seconds in self.sizes]


def run_bandwidth(comm: Any, transport_name: str, device: str, max_bytes: int, iterations: int,
                  output: str | None = None, overwrite: bool = False) -> Sweep:
    """Print (rank 0) and return the sweep of the chosen transport and memory, with its latency fit.

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
        sweep = _sweep(comm, transport_name, device, max_bytes, iterations)
        if claim is not None:
            settings = {"iterations": iterations, "max_bytes": max_bytes}
            claim.write(lambda h5: _write(h5, sweep, origin, settings))
    return sweep


def _write(f: Any, sweep: Sweep, origin: dict[str, Any], settings: dict[str, Any]) -> None:
    """The sweep into the open HDF5 file ``f``, with the provenance a results file has at its root."""
    from hilbert_hpc.study.results import hdf5_attr

    for key, value in origin.items():
        f.attrs[key] = hdf5_attr(value)
    f.attrs["program"] = "hilbert-hpc"
    f.attrs["study"] = "bandwidth"
    f.attrs.update(settings)
    f.attrs["finished_utc"] = utc_now()
    ds = f.create_dataset("bandwidth", data=np.asarray(sweep.rates, dtype=np.float64).reshape(-1, 2))
    ds.attrs.update({"columns": "bytes, GB/s", **sweep.attrs, "alpha_s": sweep.fit.alpha_s,
                     "b_gb_per_s": sweep.fit.gb_per_s, "fit": sweep.fit.method, "units": json.dumps(FIT_UNITS)})
    small = f.create_dataset("latency", data=np.asarray(sweep.latency, dtype=np.float64).reshape(-1, 2))
    small.attrs["columns"] = "bytes, s"


def _sweep(comm: Any, transport_name: str, device: str, max_bytes: int, iterations: int) -> Sweep:
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
    if comm.Get_rank() == 0:
        print(f"# ring exchange bandwidth, {comm.Get_size()} ranks, {device} buffers, transport "
              f"{transport.name} ({reason})")
    timed = {}
    for nbytes in [*LATENCY_BYTES, *sweep_sizes(max_bytes)]:
        send = xp.ones(nbytes // 4, dtype=np.float32)
        recv = xp.empty_like(send)
        iters = iterations if nbytes < (64 << 20) else max(3, iterations // 2)
        timed[nbytes] = seconds = exchange_seconds(comm, transport, send, recv, iters, sync)
        if comm.Get_rank() != 0:
            continue
        if nbytes < MIN_BYTES:          # the latency probes: comments, so that the rows are the sweep's
            print(f"# latency probe: {nbytes} bytes in {seconds * 1e6:.1f} us", flush=True)
            continue
        if nbytes == MIN_BYTES:
            print(f"# {'bytes':>12}  {'GB/s':>10}  {'us':>10}")
        print(f"  {nbytes:>12}  {nbytes / seconds / 1e9:>10.3f}  {seconds * 1e6:>10.1f}", flush=True)
    fit = fit_latency(list(timed), list(timed.values()))
    if comm.Get_rank() == 0:
        print(f"# fit t(bytes) = alpha + bytes / B over the {len(timed)} sizes: alpha = {fit.alpha_s * 1e6:.2f} us, "
              f"B = {fit.gb_per_s:.3f} GB/s ({fit.method})", flush=True)
    attrs = {"transport": transport.name, "reason": reason, "device": device, "ranks": comm.Get_size()}
    return Sweep([(b, timed[b]) for b in LATENCY_BYTES], [(b, s) for b, s in timed.items() if b >= MIN_BYTES],
                 attrs, fit)


@dataclass(frozen=True)
class MeasuredLink:
    """The latency fit of one bandwidth file, with its transport and where it comes from."""

    file: str
    transport: str
    device: str
    ranks: int
    fit: LatencyFit


def read_link(path: str) -> MeasuredLink:
    """The fit of a bandwidth file (its ``alpha_s`` and ``b_gb_per_s``; files written before they were recorded:
    :func:`fit_latency` of their sweep); a UserError naming the file when it is malformed."""
    import h5py

    from hilbert_hpc.study.report_read import PARAM, plain, read_bandwidth_file
    from hilbert_hpc.study.results_read import READ_ERRORS
    from hilbert_hpc.errors import UserError

    sweep = read_bandwidth_file(path)
    try:
        with h5py.File(path, "r") as h5:
            attrs = {key: plain(value) for key, value in h5["bandwidth"].attrs.items()}
    except READ_ERRORS as exc:
        raise UserError(f"{str(path)!r}: the bandwidth file cannot be read ({exc})", PARAM) from None
    if "alpha_s" in attrs and "b_gb_per_s" in attrs:
        fit = LatencyFit(float(attrs["alpha_s"]), float(attrs["b_gb_per_s"]), str(attrs.get("fit", "")))
    else:
        usable = [(b, b / (r * 1e9)) for b, r in sweep.sizes if b > 0 and r > 0]
        if len(usable) < 2:
            raise UserError(f"{str(path)!r}: a bandwidth file without alpha_s and b_gb_per_s, and too few sizes "
                            f"to fit them", PARAM)
        fit = fit_latency(*zip(*usable))
    if not (fit.alpha_s > 0 and fit.gb_per_s > 0):
        raise UserError(f"{str(path)!r}: alpha_s {fit.alpha_s} and b_gb_per_s {fit.gb_per_s} must be positive", PARAM)
    return MeasuredLink(sweep.file, sweep.transport, sweep.device, sweep.ranks, fit)
