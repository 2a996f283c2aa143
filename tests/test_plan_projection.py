"""plan --project: the step model's terms on tiny cases by hand, its flags, and the billion-token job."""

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
from hilbert_hpc.study.projection import max_tokens, project
from hilbert_hpc.study.step_figures import (RATES, Figures, Rate, parse_counts, parse_fixed_us, parse_rate)
from hilbert_hpc.study.step_model import FixedCost

ROOT = Path(__file__).resolve().parents[1]

#: 1000 FLOP/s forward, 2000 backward
SLOW = Rate(1e-9, 2e-9, "test")
#: a link of 0.5 s latency and 1 byte/s; a ring step costs 0.25 s (0.75 s backward), a launch 0.125 (0.375)
HOP, LAUNCH = FixedCost(0.25, 0.75, "test"), FixedCost(0.125, 0.375, "test")


def figures(gb_per_s: float = 1e-9) -> Figures:
    return Figures(rate=SLOW, gb_per_s=gb_per_s, alpha_s=0.5, hop=HOP, launch=LAUNCH)


def tiny(**kw) -> Case:
    """N = 16, H = 1, D = 4, one pattern (16, 1) over the whole sequence, float64 on NumPy, its rows rotated
    around a ring unless ``long_schedule`` says otherwise."""
    kw.setdefault("long_schedule", "ring")
    return Case(case_id="0000-tiny", name="tiny", grid=(16,), patterns=(Pattern(16, 1),), heads=1, head_dim=4,
                dtype="float64", backend="numpy", **kw)


def test_a_ring_forward_on_two_ranks_by_hand():
    # each rank's 8 queries attend 16 keys: 128 pairs x 4 D = 2048 FLOPs a rank, 1024 a step over 2 steps;
    # the first step exchanges a block of 8 rows x (4 + 4) values x 8 bytes = 512 bytes: 0.5 + 512 s
    row = project(tiny(), 2, figures())
    assert (row.tokens_per_rank, row.flops, row.imbalance, row.sent_bytes) == (8, 2048.0, 1.0, 512)
    fwd = row.forward
    assert (fwd.local_s, fwd.long_s, fwd.fixed_s) == (0.0, pytest.approx(2.048), pytest.approx(0.5))
    assert fwd.exposed_s == pytest.approx(512.5 - 1.024)
    assert row.backward.total_s == 0.0 and row.step_s == pytest.approx(2.048 + 511.476 + 0.5)
    assert row.terms.dominant == "exposed" and row.fits is None and row.max_tokens is None
    assert [s.describe() for s in row.schedules] == ["(16, 1) over 2 ranks: ring"]
    assert row.hop is HOP and row.launch is None and row.link.alpha_source == "--latency-us"
    # at 1 kB/s the exchange (1.012 s) hides behind the step's compute (1.024 s): compute and the fixed costs
    fast = project(tiny(), 2, figures(1e-6))
    assert fast.forward.exposed_s == 0.0 and fast.step_s == pytest.approx(2.048 + 0.5)
    assert fast.terms.dominant == "long"


def test_a_ring_backward_on_two_ranks_by_hand():
    # backward 2.5 x 2048 FLOPs at 2000 FLOP/s: 1.28 s a step; step 0 moves the K/V block (0.5 + 512 s),
    # step 1 the float64 accumulator block (64 values, 0.5 + 512 s), then the accumulator goes home (0.5 + 512 s)
    row = project(tiny(pass_="forward+backward"), 2, figures())
    bwd = row.backward
    assert bwd.long_s == pytest.approx(2.56) and bwd.fixed_s == pytest.approx(1.5) and bwd.local_s == 0.0
    assert bwd.exposed_s == pytest.approx(2 * (512.5 - 1.28) + 512.5)
    assert row.flops == 2048 * 3.5 and row.sent_bytes == 512 + 512 + 1024
    assert row.step_s == pytest.approx(row.forward.total_s + bwd.total_s)
    # memory: the training step's, without the study's float64 gradient check of the sampled rows
    at_two = dataclasses.replace(tiny(pass_="forward+backward"), ranks=2)
    assert row.memory_bytes == estimate(at_two, True, accuracy_rows=0).memory_bytes
    check = reference_bytes(at_two.tokens, at_two.heads, at_two.head_dim, at_two.patterns, 32)
    assert row.memory_bytes + check == estimate(at_two, True).memory_bytes


def with_local(**kw) -> Case:
    """tiny with a local pattern (4, 1) too: each rank's 8 queries attend 4 keys, 512 FLOPs (0.512 s)."""
    return dataclasses.replace(tiny(**kw), patterns=(Pattern(4, 1), Pattern(16, 1)))


def test_a_gathered_pattern_by_hand():
    # forward: local 0.512 s, long 2.048 s and one launch; the exchange to the one other rank, 0.5 + 512 / 1000
    # s at 1 kB/s, is posted before the local pattern and shows only beyond it: 1.012 - 0.512 = 0.5 s
    row = project(with_local(long_schedule="gather", pass_="forward+backward"), 2, figures(1e-6))
    fwd, bwd = row.forward, row.backward
    assert (fwd.local_s, fwd.long_s) == (pytest.approx(0.512), pytest.approx(2.048))
    assert fwd.exposed_s == pytest.approx(0.5) and fwd.fixed_s == 0.125
    # backward: local 2.5 x 512 / 2000 = 0.64 s, long 2.56 s, one launch; the float64 terms go home (the same
    # 512 bytes: 1.012 s), hidden behind the local backward but 0.372 s
    assert (bwd.local_s, bwd.long_s) == (pytest.approx(0.64), pytest.approx(2.56))
    assert bwd.exposed_s == pytest.approx(1.012 - 0.64) and bwd.fixed_s == 0.375
    assert row.hop is None and row.launch is LAUNCH
    assert [s.describe() for s in row.schedules] == ["(16, 1) over 2 ranks: gather"]
    # it sends its block once and the other rank's terms home once: 512 + 512 bytes
    assert row.sent_bytes == 1024


def test_plan_counts_the_gathered_rows_instead_of_the_ring_buffers():
    """A gathered pattern holds its group's rows twice, and in the backward their float32 (here float64) terms
    twice and the terms coming home; a ring pattern two K/V blocks and three accumulator blocks."""
    from hilbert_hpc.study.setup import plan_setup

    for pass_, ring_part in (("forward", 2 * 512), ("forward+backward", 2 * 512 + 3 * 512)):
        ring, gather = (dataclasses.replace(tiny(pass_=pass_, long_schedule=s), ranks=2) for s in ("ring", "gather"))
        (schedule,) = plan_setup(gather).schedules
        held = schedule.gather_bytes(8, pass_ != "forward")
        assert held == (2 * 128 * 8 if pass_ == "forward" else 2 * 128 * 8 + 2 * 128 * 8 + 2 * 64 * 8)
        assert estimate(gather).memory_bytes - estimate(ring).memory_bytes == held - ring_part


def test_plan_shows_each_long_patterns_schedule(tmp_path, capsys):
    from hilbert_hpc.cli import main

    from jobtext import QUICK, JobSpec

    spec = JobSpec({"name": "sched", **QUICK}, defaults={"heads": 2, "head_dim": 8, "dtype": "float64"},
                   cases=[{"name": "g", "tokens": 256, "patterns": [[64, 1], [256, 4]], "long_schedule": "gather"},
                          {"name": "r", "tokens": 256, "patterns": [[64, 1], [256, 4]], "long_schedule": "ring"},
                          {"name": "l", "tokens": 256, "patterns": [[64, 1]]}])
    (tmp_path / "j.toml").write_text(spec.text())
    assert main(["plan", str(tmp_path / "j.toml"), "-n", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = {line.split()[0]: i for i, line in enumerate(lines) if line[:4].isdigit()}
    assert lines[at["0000-g"] + 1].strip() == "long patterns: (256, 4) over 2 ranks: gather"
    assert lines[at["0001-r"] + 1].strip() == "long patterns: (256, 4) over 2 ranks: ring"
    assert at["0002-l"] == len(lines) - 1                  # all local: no schedule line


def test_causal_imbalance_by_hand():
    # contiguous: rank 0's queries 0..7 attend 1..8 keys (36 pairs), rank 1's 9..16 (100): the slowest does
    # 100 x 16 FLOPs
    row = project(tiny(causal=True, placement="contiguous"), 2, figures())
    assert row.flops == 1600.0 and row.imbalance == pytest.approx(100 / 68)
    # the slowest rank is the last of the contiguous causal ring: 2 steps, one receiving; rank 0 makes 1 step
    assert row.forward.long_s == pytest.approx(1.6) and row.forward.fixed_s == pytest.approx(0.5)
    # zigzag (what auto picks for a causal case): rank 0 holds queries 0..3 and 12..15 (10 + 58 pairs), rank 1
    # 4..7 and 8..11 (26 + 42): 68 pairs each
    row = project(tiny(causal=True), 2, figures())
    assert row.flops == 68 * 16.0 and row.imbalance == 1.0
    one = project(tiny(causal=True), 1, figures())
    assert (one.flops, one.sent_bytes, one.forward.exposed_s, one.link) == (136 * 16.0, 0, 0.0, None)
    assert one.forward.local_s == pytest.approx(2.176) and one.schedules == ()


def test_fits_and_the_largest_sequence():
    row = project(tiny(), 2, figures(), 1 << 30)
    per_token = row.memory_bytes / 8                        # memory per rank = per_token x N / 2
    assert row.fits is True and row.max_tokens & (row.max_tokens - 1) == 0
    assert per_token * row.max_tokens / 2 <= 1 << 30 < per_token * row.max_tokens
    assert project(tiny(), 2, figures(), 1000).fits is False
    assert max_tokens(1000, 10, 4, 1000) == 32          # 100 bytes a token, 10 tokens a rank at most: N <= 40
    assert max_tokens(1000, 10, 3, 1000) == 0           # no power of two <= 30 that 3 divides
    assert max_tokens(1000, 10, 1, 50) == 0


def test_rates_default_to_the_measured_ones_and_refuse_an_unmeasured_dtype():
    bf16 = dataclasses.replace(tiny(), dtype="bfloat16", backend="cuda")
    assert Figures().rate_of(bf16) is RATES[("bfloat16", False)]
    assert Figures(rate=SLOW).rate_of(bf16) is SLOW
    with pytest.raises(ConfigError, match="--rate-tflops: no measured rate for float64"):
        Figures().rate_of(tiny())


def test_built_in_figures_say_where_they_come_from_and_which_are_not_measured():
    from hilbert_hpc.study.step_figures import NOT_MEASURED

    f = Figures()
    link = f.link("cuda-aware")
    assert (link.alpha_s, link.gb_per_s) == (36.2e-6, 150.4) and "bw_cuda_aware.h5" in link.alpha_source
    assert NOT_MEASURED in f.link("host").alpha_source
    measured = "measured on 2x H200, staged: docs/measurements/long_staged_2xh200.h5, "
    assert f.hop_of("cuda").forward_s == 0.914e-3 and f.hop_of("cuda").source.startswith(measured + "bf16 ring")
    assert f.hop_of("cuda-fp32").backward_s == 3.15e-3 and f.hop_of("cuda-fp32").source.startswith(measured)
    assert f.launch_of("cuda").forward_s == 1.08e-3 and f.launch_of("cuda").source.startswith(measured + "bf16 gat")
    assert f.launch_of("cuda-fp32").backward_s == 1.16e-3 and f.launch_of("cuda-fp32").source.startswith(measured)
    for fixed in (f.hop_of, f.launch_of):
        numpy, cuda = fixed("numpy"), fixed("cuda")
        assert (numpy.forward_s, numpy.backward_s) == (cuda.forward_s, cuda.backward_s)
        assert numpy.source == f"{NOT_MEASURED} for backend 'numpy': backend cuda's stands in ({cuda.source})"
    # alpha and B of two transports, the ring step and the launch of three backends
    assert len(f.notes()) == 10


def test_parsing():
    assert parse_counts("8,16,32,64") == [8, 16, 32, 64]
    assert parse_rate("300") == Rate(300.0, 300.0, "--rate-tflops")
    assert parse_rate("300,250").backward_tflops == 250.0
    assert parse_fixed_us("20,30", "--hop-us") == FixedCost(20e-6, 30e-6, "--hop-us")
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
    (["--project", "8", "--latency-us", "0"], "--latency-us: expected a positive number, got '0'"),
    (["--project", "8", "--hop-us", "5,x"], "--hop-us: expected a positive number, got 'x'"),
    (["--project", "8", "--launch-us", "1,2,3"], "--launch-us: expected FWD or FWD,BWD microseconds, got '1,2,3'"),
    (["--project", "8", "--transport", "staged"], "--project: a projection is for GPUs: leave out "
                                                  "--host-memory and --transport"),
    (["-n", "8", "--rate-tflops", "100"], "--rate-tflops/--bandwidth-gbs/--latency-us/--hop-us/--launch-us/--from: "
                                          "only apply to a projection: add --project P1,P2,..."),
    (["-n", "8", "--hop-us", "100"], "--rate-tflops/--bandwidth-gbs/--latency-us/--hop-us/--launch-us/--from: "
                                     "only apply to a projection: add --project P1,P2,..."),
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
    lines = out.splitlines()
    at = [i for i, line in enumerate(lines) if line.split() and line.split()[0] in ("64", "128")]
    rows = [lines[i].split() for i in at]
    assert len(rows) == 4, out                              # 64 and 128 GPUs, causal or not
    assert [r[3] for r in rows] == ["NO", "yes"] * 2
    assert {r[-1] for r in rows} == {"536,870,912", "1,073,741,824"}
    assert {r[-2] for r in rows} == {"local"}               # the local patterns' compute dominates
    assert all(lines[i + 1].strip().startswith("long patterns: (33554432, 16384) over ") for i in at)
    assert "not a measurement" in out and "link cuda-aware: alpha 36.2 us" in out


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
    assert "check:" not in out                              # no multi-rank case to check
    # a forward-only result cannot give a forward+backward case its backward rate
    assert main(["plan", str(tmp_path / "both.toml"), "--project", "2", "--from", str(tmp_path / "fwd.h5")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("hilbert-hpc: error: --from: case 0000-s of ") and captured.err.count("\n") == 1
    assert captured.out == ""
