"""The backward ring's counters in the results of a forward+backward study: recorded on several ranks, zero on
one rank and for forward cases, kept apart from the forward ring's, and shown by the report."""

from __future__ import annotations

import io

import h5py
import numpy as np
import pytest

from jobtext import JobSpec, run_on_every_rank

RING_BACKWARD = ("backward_local_s", "backward_compute_s", "backward_wait_s", "backward_pack_s",
                 "backward_imbalance_s", "backward_bytes_sent", "backward_ring_steps", "backward_messages")
#: the backward ring's counters in seconds
BACKWARD_TIMES = RING_BACKWARD[:5]

#: 1 and 2 ranks (and 4 ... under more), both passes: the global pattern (N, N/64) spans every rank's shard
JOB = JobSpec({"name": "ringcount", "repeats": 2, "warmup": 0, "accuracy_rows": 4},
              defaults={"heads": 2, "head_dim": 8, "backend": "numpy", "dtype": "float64"},
              cases=[{"name": "r", "grid": [32, 32], "ranks": "pow2", "patterns": [[64, 1], ["N", "N/64"]],
                      "sweep": {"pass": ["forward", "forward+backward"]}}])


def test_the_record_names_the_backward_ring_counters_apart_from_the_forward_ring():
    from hilbert_hpc.distributed.ring import RingStats
    from hilbert_hpc.study import record as rec

    assert tuple(rec.RING_BACKWARD_STATS) == RING_BACKWARD
    assert all(hasattr(RingStats(), counter) for counter in rec.RING_BACKWARD_STATS.values())
    assert not set(RING_BACKWARD) & set(rec.RING_STATS) and not set(rec.RING_BACKWARD_TIMES) & set(rec.RING_TIMES)
    assert rec.RING_BACKWARD_TIMES == BACKWARD_TIMES


@pytest.mark.mpi(min_size=2)
def test_a_forward_backward_study_records_the_backward_ring_counters(tmp_path_factory):
    from hilbert_hpc.study.report import report

    out = run_on_every_rank(JOB.text(), tmp_path_factory, "ringcount")
    if out is None:
        return
    with h5py.File(out) as f:
        cases = {(int(g.attrs["ranks"]), str(g.attrs["pass"])): g["timings"] for g in f["cases"].values()}
        schedules = {int(g.attrs["ranks"]): str(g.attrs["long_schedules"]) for g in f["cases"].values()}
        assert {p for p, _ in cases} >= {1, 2}
        for (ranks, pass_), tim in cases.items():
            counters = {name: tim[name][()] for name in RING_BACKWARD}
            assert all(c.shape == (ranks, 2) for c in counters.values()), (ranks, pass_)
            if ranks == 1 or pass_ == "forward":              # no ring backward: zero, as the forward ring on one rank
                assert not any(c.any() for c in counters.values()), (ranks, pass_)
                continue
            assert (counters["backward_bytes_sent"] > 0).all() and (counters["backward_compute_s"] > 0).all()
            assert (counters["backward_local_s"] > 0).all()
            # inside the backward call: its counters add up to no more than its time
            total = sum(counters[name] for name in BACKWARD_TIMES)
            assert (total <= tim["backward"][()] * 1.01 + 1e-4).all()
            # the forward ring's counters are the forward's alone: the bytes of the forward case's ring
            assert np.array_equal(tim["bytes_sent"][()], cases[(ranks, "forward")]["bytes_sent"][()])
            if schedules[ranks].endswith("ring"):
                # every block goes round with its gradients, which are float64 here as the blocks are
                assert (counters["backward_bytes_sent"] >= 2 * tim["bytes_sent"][()]).all()
                assert (counters["backward_ring_steps"] > 0).all()
            else:
                # gathered: the backward reuses the forward's rows and sends only the terms home, a message for
                # each one the forward sent, of the same size (float64 terms of float64 rows)
                assert np.array_equal(counters["backward_bytes_sent"], tim["bytes_sent"][()])
                assert np.array_equal(counters["backward_messages"], tim["messages"][()])
                assert not counters["backward_ring_steps"].any() and not tim["ring_steps"][()].any()
    tables = report([out], stream=io.StringIO())
    rows = {(r["ranks"], "backward_wait_s" in r) for r in tables["compute_communication"]}
    assert (2, True) in rows and (2, False) in rows                # the forward+backward case and the forward one
    for r in tables["compute_communication"]:     # gathered patterns: an overhead, no ring hop to time
        assert np.isfinite(r["long_overhead"]) and np.isnan(r["hop_s"])


def test_the_long_overhead_is_the_time_beyond_local_work_and_imbalance_less_useful_work():
    from hilbert_hpc.study.report_tables import long_overhead

    # 10 s pass, 6 s local for 6 FLOPs (1 FLOP/s), 1 s imbalance, 2 long FLOPs (2 s at the local rate): 1 s over
    assert long_overhead(10.0, 6.0, 1.0, 6.0, 2.0) == pytest.approx(0.1)
    assert np.isnan(long_overhead(10.0, 0.0, 1.0, 0.0, 2.0))
