"""plan --project --from: figures taken from results and bandwidth files, and measured cases checked against their
projection."""

from __future__ import annotations

import io
from pathlib import Path

import h5py
import numpy as np
import pytest

from hilbert_hpc.study.projection import TOLERANCE, Check, check_results, print_checks
from hilbert_hpc.study.report_read import load_cases
from hilbert_hpc.study.step_figures import Figures, hop_from_results, launch_from_results

from jobtext import QUICK, JobSpec
from test_report import make_case, write_results

#: N = 16, H = 1, D = 4, the pattern (16, 1) over 2 ranks: 2048 FLOPs a rank, 2 ring steps, one 512-byte block
KERNEL = {"tokens": 16, "grid": [16], "patterns": [[16, 1]], "heads": 1, "head_dim": 4, "dtype": "float64",
          "backend": "numpy", "long_schedule": "ring"}
#: the measured forward ring (compute_s + wait_s) of each rank, and 123 useful TFLOP/s (write_results' rate)
RING_S, TFLOPS = 600.0, 123.0


def results_file(tmp_path: Path, attention_s: float) -> str:
    """A 1-rank case (the rate) and a 2-rank ring case whose ranks spent RING_S in the ring and attention_s in
    the forward."""
    ring = {"compute_s": np.full((2, 3), 0.75 * RING_S), "wait_s": np.full((2, 3), 0.25 * RING_S)}
    return write_results(tmp_path / "r.h5", [
        make_case("0000-t", np.ones((1, 3)), **KERNEL),
        make_case("0001-t", np.full((2, 3), attention_s), counters=ring,
                  attrs={"transport": "host", "long_schedules": "(16, 1) over 2 ranks: ring"}, **KERNEL)])


def slow_link(results) -> Figures:
    """0.5 s and 1 byte/s: a step's exchange takes 512.5 s, its compute 1024 FLOPs at TFLOPS."""
    return Figures(alpha_s=0.5, gb_per_s=1e-9, results=results)


def test_the_ring_step_cost_is_what_the_ring_took_beyond_the_model(tmp_path):
    results, _ = load_cases([results_file(tmp_path, 700.0)])
    hop = hop_from_results("numpy", results, slow_link(results))
    compute = 1024 / (TFLOPS * 1e12)                           # a step's
    # each rank: 2 steps, the first exchanging: max(compute, 512.5) + compute; the rest is 2 steps' fixed cost
    assert hop.forward_s == pytest.approx((RING_S - 512.5 - compute) / 2)
    assert hop.backward_s == hop.forward_s                      # no backward: the forward's stands in
    assert hop.source.startswith(f"{tmp_path / 'r.h5'}, ring case(s) 0001-t: (compute_s + wait_s")
    assert hop_from_results("cuda", results, slow_link(results)) is None


def test_a_file_of_earlier_versions_ran_rings_over_the_transport_it_asked_for(tmp_path):
    """Without ``long_schedules`` and the transport used, a multi-rank case ran rings, here over the host
    transport (transport = "auto" on a CPU backend)."""
    ring = {"compute_s": np.full((2, 3), RING_S), "wait_s": np.zeros((2, 3))}
    path = write_results(tmp_path / "old.h5", [make_case("0000-t", np.ones((1, 3)), **KERNEL),
                                               make_case("0001-t", np.ones((2, 3)), counters=ring, **KERNEL)])
    results, _ = load_cases([path])
    figures = Figures(results=results)
    assert figures.hop_of("numpy").source.startswith(f"{path}, ring case(s) 0001-t:")
    assert [key for key in figures.used] == ["alpha host", "B host"]


#: the gathered case's forward counters (compute_s, pack_s, wait_s) and backward ones (compute_s, wait_s) of each
#: rank, and the backward rate of its 1-rank case
GATHER_S, GATHER_BWD_S, BWD_TFLOPS = (100.0, 50.0, 600.0), (300.0, 700.0), 246.0


def gather_file(tmp_path: Path) -> str:
    """A 1-rank case (the rates) and a 2-rank case of the same kernel that gathered its long pattern, both
    forward+backward."""
    names = ("compute_s", "pack_s", "wait_s")
    counters = {name: np.full((2, 3), s) for name, s in zip(names, GATHER_S)}
    counters.update({f"backward_{name}": np.full((2, 3), s) for name, s in zip(("compute_s", "wait_s"),
                                                                                 GATHER_BWD_S)})
    kernel = dict(KERNEL, long_schedule="gather", **{"pass": "forward+backward"})
    path = write_results(tmp_path / "g.h5", [
        make_case("0000-t", np.ones((1, 3)), counters={"backward": np.ones((1, 3))}, **kernel),
        make_case("0001-t", np.full((2, 3), 800.0), counters=dict(counters, backward=np.full((2, 3), 1100.0)),
                  attrs={"transport": "host", "long_schedules": "(16, 1) over 2 ranks: gather"}, **kernel)])
    with h5py.File(path, "a") as f:
        f["cases/0000-t/metrics"].attrs["backward_useful_tflops"] = BWD_TFLOPS
    return path


def test_the_gathered_launch_cost_is_what_the_gather_took_beyond_the_model(tmp_path):
    """Forward: packing, waiting and the copy and launch (compute_s) less the pattern's compute and its exchange
    exposed (nothing local hides it: 0.5 + 512 s to the other rank); backward alike, the terms home."""
    results, _ = load_cases([gather_file(tmp_path)])
    launch = launch_from_results("numpy", results, slow_link(results))
    compute = 2048 / (TFLOPS * 1e12)                           # the rank's queries against the gathered rows
    assert launch.forward_s == pytest.approx(sum(GATHER_S) - 512.5 - compute)
    assert launch.backward_s == pytest.approx(sum(GATHER_BWD_S) - 512.5 - 2.5 * 2048 / (BWD_TFLOPS * 1e12))
    assert launch.source == (f"{tmp_path / 'g.h5'}, gather case(s) 0001-t: (compute_s + pack_s + wait_s - the "
                             f"model's gathered time) / gathered patterns")
    assert hop_from_results("numpy", results, slow_link(results)) is None      # no ring case
    assert launch_from_results("cuda", results, slow_link(results)) is None
    figures = slow_link(results)
    assert figures.launch_of("numpy") == launch and "gather numpy" not in figures.used
    # the projection of the case onto its 2 ranks is then its counters' time (no local pattern)
    (check,) = check_results(results, figures)
    assert check.projection.launch == launch and check.projection.hop is None
    assert check.projection.forward.total_s == pytest.approx(sum(GATHER_S))
    assert check.projection.backward.total_s == pytest.approx(sum(GATHER_BWD_S))
    assert (check.forward_s, check.backward_s) == (800.0, 1100.0)


def test_a_gather_case_without_its_counters_gives_no_launch_cost(tmp_path):
    path = gather_file(tmp_path)
    with h5py.File(path, "a") as f:
        del f["cases/0001-t/timings/pack_s"]
    results, _ = load_cases([path])
    assert launch_from_results("numpy", results, slow_link(results)) is None
    figures = slow_link(results)
    assert figures.launch_of("numpy").source.startswith("placeholder, not measured for backend 'numpy': backend "
                                                        "cuda's stands in (measured on 2x H200, staged")
    assert figures.used["gather numpy"].startswith("no multi-rank gather result of backend 'numpy' in the --from "
                                                   "files: the fixed cost of its gathered pattern's launch is the "
                                                   "built-in one (placeholder")
    assert figures.used["gather numpy"].endswith("; --launch-us gives it)")


@pytest.mark.parametrize("attention_s, within", [(700.0, True), (500.0, False)])
def test_a_measured_case_is_checked_against_its_projection(tmp_path, attention_s, within):
    """The ring's projected forward is RING_S (the step cost comes from that case); the case's forward took
    attention_s: 600 against 700 ms is -14.3 %, within 15 %; against 500, +20 %, not."""
    results, _ = load_cases([results_file(tmp_path, attention_s)])
    (check,) = check_results(results, slow_link(results))
    assert isinstance(check, Check) and check.projection.ranks == 2
    assert check.projection.forward.total_s == pytest.approx(RING_S)
    assert check.forward_s == attention_s and check.forward_deviation == pytest.approx(RING_S / attention_s - 1)
    assert np.isnan(check.backward_deviation) and check.within is within
    assert (abs(check.forward_deviation) <= TOLERANCE) is within
    stream = io.StringIO()
    print_checks([check], stream)
    row = next(line.split() for line in stream.getvalue().splitlines() if line.startswith("0001-t"))
    assert row[:5] == ["0001-t", "2", f"{RING_S * 1e3:.3f}", f"{attention_s * 1e3:.3f}",
                       f"{RING_S / attention_s - 1:+.1%}"]
    assert row[5:9] == ["-", "-", "-", "yes" if within else "NO"]
    assert "long patterns: (16, 1) over 2 ranks: ring; dominant: exposed exchange" in stream.getvalue()


def test_plan_project_from_prints_the_check(tmp_path, capsys):
    from hilbert_hpc.cli import main

    path = results_file(tmp_path, 700.0)
    spec = JobSpec({"name": "t", **QUICK}, cases=[dict(KERNEL, name="t")])
    (tmp_path / "t.toml").write_text(spec.text())
    assert main(["plan", str(tmp_path / "t.toml"), "--project", "2", "--from", path, "--latency-us", "5e5",
                 "--bandwidth-gbs", "1e-9"]) == 0
    captured = capsys.readouterr()
    out = captured.out.split("\ncheck: ", 1)
    assert len(out) == 2, captured.out
    assert "fixed cost of a ring step: forward " in out[0] and f"({path}, ring case(s) 0001-t:" in out[0]
    assert "0001-t" in out[1] and "-14.3%" in out[1] and "\nlink host: alpha 5e+05 us (--latency-us)" in out[1]
    # the rate, B and alpha come from the files or the flags; nothing built in stands in for them or the step
    assert captured.err == ""


@pytest.mark.mpi(min_size=2)
def test_figures_and_the_check_from_a_run_and_a_sweep(tmp_path_factory, capsys):
    """A CPU run of 1 and more ranks and a bandwidth sweep: the projection takes the rate of the 1-rank case,
    alpha and B of the sweep, the ring step's cost of the ring cases, the gathered launch's of the gather cases,
    and checks every multi-rank case."""
    from mpi4py import MPI

    from hilbert_hpc.cli import main
    from hilbert_hpc.study.bandwidth import read_link, run_bandwidth
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.runner import run_job
    from hilbert_hpc.study.projection import result_schedule
    from hilbert_hpc.study.step_figures import result_case
    from hilbert_hpc.study.setup import plan_setup
    from hilbert_hpc.study.step_model import StepGeometry

    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("check")) if comm.Get_rank() == 0 else None))
    spec = JobSpec({"name": "small", "repeats": 2, "warmup": 0, "accuracy_rows": 4},
                   defaults={"heads": 2, "head_dim": 8, "dtype": "float64", "backend": "numpy",
                             "pass": "forward+backward", "ranks": "pow2"},
                   cases=[{"name": "s", "tokens": 256, "patterns": [[64, 1], [256, 4]],
                           "sweep": {"long_schedule": ["ring", "gather"]}}])
    job = load_job(tmp / "small.toml", text=spec.text(), world_size=comm.Get_size())
    run_job(job, output=str(tmp / "r.h5"), stream=io.StringIO(), comm=comm, progress=io.StringIO())
    run_bandwidth(comm, "host", "cpu", 4096, 2, str(tmp / "bw.h5"))
    comm.Barrier()
    if comm.Get_rank() != 0:
        return
    (tmp / "small.toml").write_text(spec.text())
    capsys.readouterr()
    assert main(["plan", str(tmp / "small.toml"), "--project", "2", "--from", str(tmp / "r.h5"), "--from",
                 str(tmp / "bw.h5")]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""                               # no built-in figure stands in
    link = read_link(str(tmp / "bw.h5"))
    assert (f"link host: alpha {link.fit.alpha_s * 1e6:.3g} us ({tmp / 'bw.h5'}, {comm.Get_size()} ranks, cpu); "
            f"B {link.fit.gb_per_s:.4g} GB/s per rank ({tmp / 'bw.h5'}") in captured.out
    results, _ = load_cases([tmp / "r.h5"])
    multi = [r for r in results if r.ranks > 1]
    check_lines = captured.out.split("\ncheck: ", 1)[1].splitlines()
    for result in multi:
        (row,) = [line.split() for line in check_lines if line.startswith(result.case_id)]
        assert row[1] == str(result.ranks) and all(float(x) > 0 for x in (row[2], row[3], row[5], row[6]))
    # the ring step's cost is what makes the model's ring time, over every rank and step of the ring cases,
    # the measured one; the launch's, the gathered time of the gather cases
    figures = Figures(results=results, links=[link])
    for schedule, counters in (("ring", ("compute_s", "wait_s")), ("gather", ("compute_s", "pack_s", "wait_s"))):
        cost = figures.fixed_of(schedule, "numpy")
        assert cost.source.startswith(f"{tmp / 'r.h5'}, {schedule} case(s) ")
        for names, name in ((counters, "forward"), (("backward_compute_s", "backward_wait_s"), "backward")):
            measured = model = 0.0
            for result in (r for r in multi if result_schedule(r) == schedule):
                case = result_case(result, schedule)
                geometry = StepGeometry.of(case, plan_setup(case))
                rate = figures.rate_of(case)
                tflops = rate.forward_tflops if name == "forward" else rate.backward_tflops
                terms_of = geometry.forward_terms if name == "forward" else geometry.backward_terms
                for rank in range(result.ranks):
                    measured += float(np.median(sum(result.timings[c][rank] for c in names)))
                    t = terms_of(rank, tflops, figures.link("host"), cost, cost)
                    model += t.long_s + t.exposed_s + t.fixed_s
            if getattr(cost, f"{name}_s") > 0:
                assert model == pytest.approx(measured)
