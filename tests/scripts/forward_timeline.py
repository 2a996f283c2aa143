"""Where one forward call's time goes on one GPU: its GPU activities on a timeline, and its host time.

For a case of ``forward_probe.py``: after ``--warmup`` calls, one call under ``torch.profiler`` prints every GPU
activity (kernel, memset, copy) with its start after the call began on the host, its duration and the idle time
before it, then the sums (GPU busy, GPU idle, host time of the call); the call's median time alone and
behind a queued GPU sleep (the host time it exposes); then, for ``ours``, the host time of each step of the call
(``STAGES``: when it begins, what it costs) over ``--host-calls`` calls, and a ``cProfile`` of as many calls (the
host functions that cost the most, own time).

    python tests/scripts/forward_timeline.py --case d64
    python tests/scripts/forward_timeline.py --case d64-causal --top 30
    python tests/scripts/forward_timeline.py --case d64 --contender flash-dense
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forward_probe import CASES, flash_dense, inputs, ours  # noqa: E402


def gpu_timeline(call, label: str = "forward call") -> None:
    """Profile one ``call`` and print its GPU activities relative to the call's host start."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function(label):
            call()
        torch.cuda.synchronize()
    events = list(prof.events())
    host = next(e for e in events if e.name == label and e.device_type == DeviceType.CPU)
    t0 = host.time_range.start
    gpu = sorted((e for e in events if e.device_type == DeviceType.CUDA and e.name != label),
                 key=lambda e: e.time_range.start)
    print(f"{'start us':>10} {'dur us':>9} {'idle us':>8}  activity")
    busy = idle = 0.0
    last = t0
    for e in gpu:
        start, end = e.time_range.start, e.time_range.end
        gap = max(0.0, start - last)
        busy += end - start
        idle += gap
        last = max(last, end)
        print(f"{start - t0:10.1f} {end - start:9.1f} {gap:8.1f}  {e.name[:90]}")
    print(f"# GPU busy {busy / 1e3:.3f} ms, idle before and between {idle / 1e3:.3f} ms, last end "
          f"{(last - t0) / 1e3:.3f} ms; host time of the call {(host.time_range.end - t0) / 1e3:.3f} ms")


def exposed_host_ms(call, repeat: int) -> tuple[float, float]:
    """Median CUDA-event times (ms) of ``call`` as timed alone (the host's work before and between its launches
    included, as forward_probe.py times it) and behind a queued GPU sleep (the host's work hidden: the GPU's
    own time)."""
    times: dict = {"alone": [], "hidden": []}
    for _ in range(repeat):
        for how in times:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            if how == "hidden":
                torch.cuda._sleep(40_000_000)          # ~20 ms of GPU clock cycles
            a.record()
            call()
            b.record()
            b.synchronize()
            times[how].append(a.elapsed_time(b))
    return statistics.median(times["alone"]), statistics.median(times["hidden"])


#: (module, attribute) of the host steps of a 16-bit forward call that host_stages times (functions called from
#: their module's namespace, so that patching the attribute times every call)
STAGES = (("hilbert_hpc.nn", "check_arguments"), ("hilbert_hpc.nn", "_check_tensors"), ("hilbert_hpc.nn", "batch_view"),
          ("hilbert_hpc.nn", "_geometry"), ("hilbert_hpc.nn", "dilated_forward"),
          ("hilbert_hpc.backends.cuda_autograd", "forward"), ("hilbert_hpc.kernels.selection", "choose"),
          ("hilbert_hpc.backends.cuda_autograd", "forward_accumulators"), ("hilbert_hpc.kernels.providers", "provider"),
          ("hilbert_hpc.kernels.sixteen_bit", "check_arrays"), ("hilbert_hpc.kernels.sixteen_bit", "_float32_scratch"),
          ("hilbert_hpc.kernels.sixteen_bit", "local_plan"), ("hilbert_hpc.kernels.sixteen_bit", "_convert"),
          ("hilbert_hpc.kernels.sixteen_bit", "launch_parts"))


def host_stages(call, calls: int) -> None:
    """Mean host time (ms) of each step of STAGES per call, and when it is first entered after the call began."""
    import importlib
    from unittest import mock

    spent: dict = {}
    first: dict = {}
    seen: set = set()
    start = [0.0]

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            if name not in seen:
                seen.add(name)
                first.setdefault(name, []).append(t - start[0])
            try:
                return fn(*a, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    modules = [(importlib.import_module(m), a) for m, a in STAGES]
    patches = [mock.patch.object(module, a, timed(f"{module.__name__.rsplit('.', 1)[1]}.{a}", getattr(module, a)))
               for module, a in modules]
    for patch in patches:
        patch.start()
    try:
        total = 0.0
        for _ in range(calls):
            seen.clear()
            torch.cuda.synchronize()
            start[0] = time.perf_counter()
            call()
            total += time.perf_counter() - start[0]
    finally:
        for patch in patches:
            patch.stop()
    print(f"# host time of a call {total / calls * 1e3:.3f} ms; step: first entered at (ms after the call began), "
          f"time a call (ms, all its entries)")
    for name in sorted(spent, key=lambda k: statistics.median(first[k])):
        print(f"  {name:40s} {statistics.median(first[name]) * 1e3:8.3f} {spent[name] / calls * 1e3:8.3f}")


def host_profile(call, calls: int, top: int) -> None:
    """cProfile of ``calls`` calls (each followed by a synchronize): the ``top`` functions by own time."""
    prof = cProfile.Profile()
    t = time.perf_counter()
    for _ in range(calls):
        prof.enable()
        call()
        prof.disable()
        torch.cuda.synchronize()
    print(f"# {calls} calls, {(time.perf_counter() - t) / calls * 1e3:.3f} ms each with the synchronize")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="d64", choices=sorted(CASES))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--contender", default="ours", choices=("ours", "flash-dense"),
                        help="whose call (flash-dense: FlashAttention-4 on the pre-gathered rows, as forward_probe.py)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--host-calls", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    case = CASES[args.case]
    dtype, n, heads, d, causal, patterns = case
    call = (ours if args.contender == "ours" else flash_dense)(case, inputs(dtype, n, heads, d))
    print(f"# {torch.cuda.get_device_name()}: {args.contender}, case {args.case} {case[1:]}")
    with torch.no_grad():
        for _ in range(args.warmup):
            call()
        gpu_timeline(call)
        alone, hidden = exposed_host_ms(call, args.repeat)
        print(f"# timed alone {alone:.3f} ms, the host hidden {hidden:.3f} ms: {alone - hidden:.3f} ms of host time exposed")
        if args.contender == "ours":
            host_stages(call, args.host_calls)
        host_profile(call, args.host_calls, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
