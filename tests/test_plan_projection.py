"""plan --project: the projection's arithmetic on a tiny case by hand, its flags, and the billion-token job."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.errors import ConfigError
from hilbert_hpc.study.jobfile import Case, load_job
from hilbert_hpc.core.reference_backward import reference_bytes
from hilbert_hpc.study.plan import estimate
from hilbert_hpc.study.projection import (RATES, Bandwidth, Rate, max_tokens, parse_counts, parse_rate, project,
                                          rate_for)

ROOT = Path(__file__).resolve().parents[1]

#: 1000 FLOP/s forward, 2000 backward; 1 byte/s: the times are FLOPs / 1000 and bytes
SLOW = Rate(1e-9, 2e-9, "test")
ONE_BYTE = Bandwidth(1e-9, "test")


def tiny(**kw) -> Case:
    """N = 16, H = 1, D = 4, one pattern (16, 1) over the whole sequence, float64 on NumPy."""
    return Case(case_id="0000-tiny", name="tiny", grid=(16,), patterns=(Pattern(16, 1),), heads=1, head_dim=4,
                dtype="float64", backend="numpy", **kw)


def test_forward_on_two_ranks_by_hand():
    # each rank's 8 queries attend 16 keys: 128 pairs x 4 D = 2048 FLOPs a rank; the ring of 2 sends one block
    # of 8 rows x (4 + 4) values x 8 bytes = 512 bytes
    row = project(tiny(), 2, SLOW, ONE_BYTE, None)
    assert (row.tokens_per_rank, row.flops, row.imbalance, row.ring_bytes) == (8, 2048.0, 1.0, 512)
    assert row.compute_s == pytest.approx(2.048) and row.comm_s == pytest.approx(512.0)
    assert row.overlapped_s == pytest.approx(512.0) and row.serial_s == pytest.approx(514.048)
    assert row.fits is None and row.max_tokens is None


def test_forward_backward_on_two_ranks_by_hand():
    # backward 2.5 x 2048 FLOPs at 2000 FLOP/s; the ring backward sends the K/V block again (512 bytes) and the
    # dK/dV accumulator block twice (g = 2 hops, float64): 2 x 64 x 8 = 1024 bytes
    case = tiny(pass_="forward+backward")
    row = project(case, 2, SLOW, ONE_BYTE, None)
    assert row.flops == 2048 * 3.5 and row.ring_bytes == 512 + 512 + 1024
    assert row.compute_s == pytest.approx(2.048 + 2.56)
    # memory: the training step's, without the study's float64 gradient check of the sampled rows
    at_two = dataclasses.replace(case, ranks=2)
    assert row.memory_bytes == estimate(at_two, True, accuracy_rows=0).memory_bytes
    check = reference_bytes(at_two.tokens, at_two.heads, at_two.head_dim, at_two.patterns, 32)
    assert row.memory_bytes + check == estimate(at_two, True).memory_bytes


def test_causal_imbalance_by_hand():
    # contiguous: rank 0's queries 0..7 attend 1..8 keys (36 pairs), rank 1's 9..16 (100): the slowest does
    # 100 x 16 FLOPs
    row = project(tiny(causal=True, placement="contiguous"), 2, SLOW, ONE_BYTE, None)
    assert row.flops == 1600.0 and row.imbalance == pytest.approx(100 / 68)
    # zigzag (what auto picks for a causal case): rank 0 holds queries 0..3 and 12..15 (10 + 58 pairs), rank 1
    # 4..7 and 8..11 (26 + 42): 68 pairs each
    row = project(tiny(causal=True), 2, SLOW, ONE_BYTE, None)
    assert row.flops == 68 * 16.0 and row.imbalance == 1.0
    one = project(tiny(causal=True), 1, SLOW, ONE_BYTE, None)
    assert (one.flops, one.ring_bytes, one.comm_s) == (136 * 16.0, 0, 0.0)


def test_fits_and_the_largest_sequence():
    row = project(tiny(), 2, SLOW, ONE_BYTE, 1 << 30)
    per_token = row.memory_bytes / 8                        # memory per rank = per_token x N / 2
    assert row.fits is True and row.max_tokens & (row.max_tokens - 1) == 0
    assert per_token * row.max_tokens / 2 <= 1 << 30 < per_token * row.max_tokens
    assert project(tiny(), 2, SLOW, ONE_BYTE, 1000).fits is False
    assert max_tokens(1000, 10, 4, 1000) == 32          # 100 bytes a token, 10 tokens a rank at most: N <= 40
    assert max_tokens(1000, 10, 3, 1000) == 0           # no power of two <= 30 that 3 divides
    assert max_tokens(1000, 10, 1, 50) == 0


def test_rates_default_to_the_measured_ones_and_refuse_an_unmeasured_dtype():
    bf16 = dataclasses.replace(tiny(), dtype="bfloat16", backend="cuda")
    assert rate_for(bf16, None) is RATES[("bfloat16", False)]
    assert rate_for(bf16, SLOW) is SLOW
    with pytest.raises(ConfigError, match="--rate-tflops: no measured rate for float64"):
        rate_for(tiny(), None)


def test_parsing():
    assert parse_counts("8,16,32,64") == [8, 16, 32, 64]
    assert parse_rate("300") == Rate(300.0, 300.0, "--rate-tflops")
    assert parse_rate("300,250").backward_tflops == 250.0
    for bad in ("8,x", "", "0", "8,-1"):
        with pytest.raises(ConfigError, match="--project"):
            parse_counts(bad)


JOB = ROOT / "jobs" / "billion_tokens.toml"


@pytest.mark.parametrize("flags, message", [
    (["--project", "8,x"], "--project: expected GPU counts such as 8,16,32,64, got '8,x'"),
    (["--project", "0"], "--project: expected GPU counts >= 1, got '0'"),
    (["--project", "8", "--rate-tflops", "-1"], "--rate-tflops: expected a positive number, got '-1'"),
    (["--project", "8", "--rate-tflops", "1,2,3"], "--rate-tflops: expected FWD or FWD,BWD useful TFLOP/s, "
                                                    "got '1,2,3'"),
    (["--project", "8", "--bandwidth-gbs", "nan"], "--bandwidth-gbs: expected a positive number, got 'nan'"),
    (["--project", "8", "--transport", "staged"], "--project: a projection is for GPUs: leave out "
                                                  "--host-memory and --transport"),
    (["-n", "8", "--rate-tflops", "100"], "--rate-tflops/--bandwidth-gbs/--from: only apply to a projection: add "
                                          "--project P1,P2,..."),
])
def test_flag_errors_are_one_line_exit_2(capsys, flags, message):
    from hilbert_hpc.cli import main

    assert main(["plan", str(JOB), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"hilbert-hpc: error: {message}\n"


def test_plan_needs_ranks_or_a_projection(capsys):
    from hilbert_hpc.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["plan", str(JOB)])
    assert exc.value.code == 2 and "one of the arguments -n/--ranks --project is required" in capsys.readouterr().err


def test_billion_token_job_plans_without_a_gpu(capsys, monkeypatch):
    from hilbert_hpc.cli import main

    monkeypatch.setitem(sys.modules, "cupy", None)          # import cupy -> ImportError
    job = load_job(JOB)
    assert [c.tokens for c in job.cases] == [1 << 30] * 2 and job.cases[0].pass_ == "forward+backward"
    assert main(["plan", str(JOB), "--project", "8,16,32,64,128", "--gpu", "H200"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in ("64", "128")]
    assert len(rows) == 4, out                              # 64 and 128 GPUs, causal or not
    assert [r[3] for r in rows] == ["NO", "yes"] * 2
    assert {r[-1] for r in rows} == {"536,870,912", "1,073,741,824"}
    assert "not a measurement" in out


SMALL = """
[job]
name = "small"
repeats = 2
warmup = 0

[[cases]]
name = "s"
tokens = 256
heads = 2
head_dim = 8
dtype = "float64"
backend = "numpy"
pass = "{pass_}"
patterns = [[64, 1], [256, 4]]
"""


def test_rates_from_a_results_file(tmp_path, capsys):
    from hilbert_hpc.cli import main
    from hilbert_hpc.study.report_read import load_cases

    (tmp_path / "both.toml").write_text(SMALL.format(pass_="forward+backward"))
    (tmp_path / "fwd.toml").write_text(SMALL.format(pass_="forward"))
    for name in ("both", "fwd"):
        assert main(["run", str(tmp_path / f"{name}.toml"), "-o", str(tmp_path / f"{name}.h5")]) == 0
    capsys.readouterr()
    result = load_cases([tmp_path / "both.h5"])[0][0]
    assert main(["plan", str(tmp_path / "both.toml"), "--project", "1,2", "--from", str(tmp_path / "both.h5")]) == 0
    out = capsys.readouterr().out
    assert (f"rate forward {result.metrics.useful_tflops:g} / backward {result.metrics.backward_useful_tflops:g} "
            f"useful TFLOP/s per GPU ({tmp_path / 'both.h5'}, case 0000-s, medians of 2)") in out
    # a forward-only result cannot give a forward+backward case its backward rate
    assert main(["plan", str(tmp_path / "both.toml"), "--project", "2", "--from", str(tmp_path / "fwd.h5")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hilbert-hpc: error: --from: case 0000-s of ") and err.count("\n") == 1


@pytest.mark.mpi(min_size=2)
def test_ring_bandwidth_from_a_two_rank_result(tmp_path_factory):
    """The 1- and 2-rank cases of one run give the projection its rates and its ring bandwidth."""
    import io

    from mpi4py import MPI

    from hilbert_hpc.study.report_read import load_cases
    from hilbert_hpc.study.runner import run_job

    comm = MPI.COMM_WORLD
    tmp = Path(comm.bcast(str(tmp_path_factory.mktemp("project")) if comm.Get_rank() == 0 else None))
    text = SMALL.format(pass_="forward+backward").replace('name = "s"', 'name = "s"\nranks = "pow2"')
    job = load_job(tmp / "small.toml", text=text, world_size=comm.Get_size())
    out = run_job(job, output=str(tmp / "r.h5"), stream=io.StringIO(), comm=comm, progress=io.StringIO())
    comm.Barrier()
    if comm.Get_rank() != 0:
        return
    from hilbert_hpc.study.projection import print_projection, result_bandwidth

    results = load_cases([out])[0]
    two = next(r for r in results if r.ranks == 2)
    bandwidth = result_bandwidth(results)
    assert bandwidth.gbs == pytest.approx(float(two.metrics.ring_gb_per_s)) and bandwidth.gbs > 0
    stream = io.StringIO()
    rows = print_projection(job, [2], stream, results=results)
    assert f"ring bandwidth: {bandwidth.gbs:g} GB/s per rank ({out}, case 0001-s, 2 ranks)" in stream.getvalue()
    assert rows[0].comm_s == pytest.approx(rows[0].ring_bytes / (bandwidth.gbs * 1e9))
