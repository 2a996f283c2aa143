"""report's load imbalance table: the ranks' useful FLOPs and their attention
(and backward) times, largest / mean across ranks; files without per-rank FLOPs show '-'."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from test_report import make_case, run_report, timings, write_results

from hilbert_hpc.core.patterns import Pattern
from hilbert_hpc.core.work import rank_useful_flops


def _per_rank_ratio(a: np.ndarray) -> float:
    return float(np.median(a.max(axis=0) / a.mean(axis=0)))


def test_imbalance_columns(tmp_path):
    rng = np.random.default_rng(40)
    att, bwd = timings(rng, 4, 0.1, repeats=3), timings(rng, 4, 0.25, repeats=3)
    flops = np.asarray(rank_useful_flops(4096, 4, 2, 16, [Pattern(4096, 1)], causal=True), dtype=np.float64)
    counters = {"useful_flops": np.repeat(flops[:, None], 3, axis=1)}
    cases = [make_case("fwd", att, counters=counters, name="fwd"),
             make_case("both", att, counters=counters, name="both", **{"pass": "forward+backward"}),
             make_case("old", att, name="old")]
    path = write_results(tmp_path / "i.h5", cases)
    with h5py.File(path, "r+") as f:
        f["cases"]["both"]["timings"]["backward"] = bwd
    tables, text = run_report([path])
    rows = {r["case"]: r for r in tables["imbalance"]}
    expected = float(flops.max() / flops.mean())
    assert expected == pytest.approx(1.75, rel=1e-3)
    for cid in ("fwd", "both"):
        assert rows[cid]["flops_imbalance"] == pytest.approx(expected)
        assert rows[cid]["attention_imbalance"] == pytest.approx(_per_rank_ratio(att))
    assert rows["both"]["backward_imbalance"] == pytest.approx(_per_rank_ratio(bwd))
    assert "backward_imbalance" not in rows["fwd"]
    assert np.isnan(rows["old"]["flops_imbalance"])
    assert "load imbalance" in text and "attn time" in text and "bwd time" in text
    assert f"{expected:.3f}" in text


def test_forward_only_files_have_no_backward_imbalance_column(tmp_path):
    rng = np.random.default_rng(41)
    path = write_results(tmp_path / "f.h5", [make_case("one", timings(rng, 1, 0.1)),
                                             make_case("two", timings(rng, 2, 0.1))])
    tables, text = run_report([path])
    (row,) = tables["imbalance"]
    assert "bwd time" not in text and "backward_imbalance" not in row


def test_imbalance_rows_name_the_placement_used(tmp_path):
    rng = np.random.default_rng(42)
    flops = np.asarray(rank_useful_flops(4096, 4, 2, 16, [Pattern(4096, 1)], causal=True, placement="zigzag"),
                       dtype=np.float64)
    counters = {"useful_flops": np.repeat(flops[:, None], 3, axis=1)}
    path = write_results(tmp_path / "z.h5", [make_case("zig", timings(rng, 4, 0.1, repeats=3), counters=counters, name="zig"),
                                             make_case("old", timings(rng, 4, 0.1, repeats=3), name="old")])
    with h5py.File(path, "r+") as f:
        f["cases"]["zig"].attrs["placement"] = "zigzag"
    tables, text = run_report([path])
    rows = {r["case"]: r for r in tables["imbalance"]}
    assert rows["zig"]["placement"] == "zigzag" and rows["zig"]["flops_imbalance"] == pytest.approx(1.0)
    assert rows["old"]["placement"] == "contiguous"           # files from before placements ran contiguous
    assert "zigzag" in text
