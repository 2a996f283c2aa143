"""The accuracy check samples rows that the patterns select, the same rows on any rank count, and says how many."""

from __future__ import annotations

import io
import time

import h5py
import numpy as np
import pytest

from hilbert_hpc.study.jobfile import load_job
from hilbert_hpc.core.patterns import Pattern

from jobtext import QUICK, job_text

#: one sparse pattern: of 1024 rows only those with s % 64 in {0, 1} are selected (one head each)
SPARSE = job_text(name="sparse", seed=0, **QUICK, cases=[
    {"name": "sparse", "tokens": 1024, "heads": 2, "head_dim": 8, "dtype": "float64", "patterns": [[1024, 64]]}])


def _uniform_rows(seed: int, tokens: int, rows: int) -> np.ndarray:
    """The rows the check used to take: uniform over all tokens."""
    return np.random.default_rng(seed).choice(tokens, rows, replace=False)


def test_a_wrong_output_in_the_only_selected_rows_is_caught(tmp_path, monkeypatch):
    """Uniform sampling of this job picks only rows no pattern selects (output 0, reference 0): a wrong output
    went unseen with max_rel_err 0.0. The check now samples selected rows, catches it and counts the pairs."""
    from hilbert_hpc.backends.numpy_backend import NumpyBackend
    from hilbert_hpc.study.runner import run_job

    assert not np.isin(_uniform_rows(0, 1024, 4) % 64, [0, 1]).any()       # the premise: nothing selected
    right = NumpyBackend.serialized_attention
    monkeypatch.setattr(NumpyBackend, "serialized_attention", lambda *a, **k: right(*a, **k) * 1.01)
    (tmp_path / "job.toml").write_text(SPARSE)
    out = run_job(load_job(tmp_path / "job.toml"), output=str(tmp_path / "r.h5"), stream=io.StringIO(),
                  progress=io.StringIO())
    with h5py.File(out) as f:
        acc = f["cases/0000-sparse/accuracy"].attrs
        assert acc["max_rel_err"] > 1e-3 and not acc["within_tolerance"]
        assert acc["rows"] == 4 and acc["selected_pairs"] == 4        # one selected head per sampled row


def test_the_table_shows_what_the_figure_rests_on(tmp_path):
    from hilbert_hpc.study.runner import run_job

    (tmp_path / "job.toml").write_text(SPARSE)
    stream = io.StringIO()
    run_job(load_job(tmp_path / "job.toml"), output=str(tmp_path / "r.h5"), stream=stream, progress=io.StringIO())
    header, _, row = stream.getvalue().splitlines()[1:4]
    assert header.split()[-1] == "checked" and row.split()[-1] == "4"


@pytest.mark.parametrize("tokens, heads, patterns, rows", [
    (1024, 2, [(1024, 64)], 4),                       # few selected rows: listed, then sampled
    (1024, 3, [(1024, 64)], 1000),                    # fewer selected rows than asked: all of them
    (4096, 8, [(256, 1), (4096, 16)], 32),            # dense: every row selected
    (1 << 26, 4, [(1 << 20, 1 << 16), (1 << 24, 1 << 18)], 64),   # 64M tokens: drawn, never listed
    (1 << 26, 1, [(1 << 26, 1 << 26)], 8),            # a single selected row in 64M
])
def test_sampled_rows_are_distinct_selected_and_reproducible(tokens, heads, patterns, rows):
    from hilbert_hpc.core.reference import sample_selected_rows, selected_heads

    pats = [Pattern(*p) for p in patterns]
    t0 = time.perf_counter()
    s = sample_selected_rows(tokens, heads, pats, rows, seed=7)
    assert time.perf_counter() - t0 < 1.0
    assert np.array_equal(s, sample_selected_rows(tokens, heads, pats, rows, seed=7))
    assert np.array_equal(s, np.unique(s)) and s.min() >= 0 and s.max() < tokens
    assert selected_heads(s, heads, pats).any(axis=1).all()
    if tokens <= 1 << 16:
        every = np.flatnonzero(selected_heads(np.arange(tokens), heads, pats).any(axis=1))
        assert s.size == min(rows, every.size)
        if rows >= every.size:                         # asked for more than there are: every selected row
            assert np.array_equal(s, every)
    else:
        assert s.size == min(rows, sum(tokens // p.dilation for p in pats))
    assert sample_selected_rows(tokens, heads, pats, 0, seed=7).size == 0


def test_selection_is_drawn_uniformly_over_the_union():
    """Rows selected by both of two overlapping patterns are not favoured over rows selected by one."""
    from hilbert_hpc.core import reference
    from hilbert_hpc.core.reference import sample_selected_rows

    pats = [Pattern(64, 4), Pattern(64, 8)]          # heads 2: residues {0,1} mod 4 and {0,1} mod 8
    old = reference.LIST_SELECTED
    try:
        reference.LIST_SELECTED = 0                       # force the drawing branch on a small problem
        counts = np.zeros(1 << 12, dtype=np.int64)
        for seed in range(400):
            counts[sample_selected_rows(1 << 12, 2, pats, 4, seed)] += 1
    finally:
        reference.LIST_SELECTED = old
    s = np.arange(1 << 12)
    both, one = (s % 8 < 2), (s % 4 < 2) & ~(s % 8 < 2)
    assert counts[~(both | one)].sum() == 0
    assert abs(counts[both].mean() / counts[one].mean() - 1.0) < 0.25


@pytest.mark.parametrize("ordering", ["natural", "hilbert"])
def test_the_same_rows_and_figures_on_1_2_and_4_ranks(ordering):
    """Each rank checks the sampled rows it owns; together they are the rows one rank checks, with equal errors."""
    from hilbert_hpc.backends.numpy_backend import NumpyBackend
    from hilbert_hpc.core.inputs import random_rows
    from hilbert_hpc.study.jobfile import Case
    from hilbert_hpc.study.measure import combine_accuracy, local_accuracy
    from hilbert_hpc.study.setup import case_layout

    case = Case(case_id="0000-c", name="c", grid=(32, 32), patterns=(Pattern(64, 1), Pattern(1024, 16)),
                heads=4, head_dim=8, dtype="float64", ordering=ordering)
    layout1 = case_layout(case, 1)
    q, k, v = (random_rows(5, t, layout1.shard_natural(0), case.heads, case.head_dim, np.float64)
               for t in ("q", "k", "v"))
    full = NumpyBackend().serialized_attention(q, k, v, case.patterns, False, case.softmax_scale)
    full *= 1.001
    found = {}
    for ranks in (1, 2, 4):
        layout = case_layout(case, ranks)
        parts = [local_accuracy(case, 5, 12, full[r * layout.shard:(r + 1) * layout.shard], layout, r)
                 for r in range(ranks)]
        found[ranks] = combine_accuracy(parts)
    for ranks in (2, 4):
        for key in ("rows", "selected_pairs", "max_abs_err", "max_rel_err"):
            assert found[ranks][key] == found[1][key], (ranks, key)
        assert found[ranks]["rel_l2_err"] == pytest.approx(found[1]["rel_l2_err"], rel=1e-12)
    assert found[1]["rows"] == 12 and found[1]["max_rel_err"] > 0
