"""Trust in what a forward+backward run says: the gradient check of results whose exact gradients are 0 (and of
real errors), the run table's backward columns, and the scaling plots of forward+backward studies."""

from __future__ import annotations

import io
import math

import h5py
import numpy as np
import pytest

from jobtext import JobSpec

#: every segment of the pattern (4, 4) selects one row per head: each selected row attends to itself alone
DEGENERATE = JobSpec({"name": "alone", "repeats": 1, "warmup": 0, "accuracy_rows": 8},
                     defaults={"heads": 4, "head_dim": 8, "backend": "numpy", "pass": "forward+backward"},
                     cases=[{"name": "a", "grid": [8, 8], "patterns": [[4, 4]],
                             "sweep": {"dtype": ["float64", "float32"], "causal": [False, True]}}])


def _run(tmp_path, spec: JobSpec) -> tuple[str, str, str]:
    """Run the job in this process on one rank: (results file, the run's table, its stderr)."""
    from contextlib import redirect_stderr

    from hilbert_hpc.distributed.mpi import SingleProcessComm
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.runner import run_job

    (tmp_path / "job.toml").write_text(spec.text())
    job = load_job(str(tmp_path / "job.toml"), world_size=1)
    table, err = io.StringIO(), io.StringIO()
    with redirect_stderr(err):
        run_job(job, str(tmp_path / "r.h5"), stream=table, comm=SingleProcessComm(), progress=io.StringIO())
    return str(tmp_path / "r.h5"), table.getvalue(), err.getvalue()


def _accuracy(path: str) -> dict[str, dict]:
    with h5py.File(path) as f:
        return {cid: dict(g["accuracy"].attrs) for cid, g in f["cases"].items()}


# --- the gradient check ------------------------------------------------------------------------------------------

def test_rows_that_attend_to_themselves_alone_are_within_tolerance(tmp_path):
    """Exact dQ = dK = 0 (each selected query's only key is itself), computed as rounding: not an error."""
    path, _, err = _run(tmp_path, DEGENERATE)
    for cid, acc in _accuracy(path).items():
        assert acc["within_tolerance"], (cid, {k: v for k, v in acc.items() if k.startswith("grad_")})
        assert max(acc[f"grad_{t}_{e}"] for t in "qkv" for e in ("max_rel_err", "rel_l2_err")) <= acc["tolerance"]
    assert "warning" not in err


def _setup_and_gradients(patterns, dtype="float64", causal=False, zero_dout=False):
    """A one-rank forward+backward case of ``patterns`` and the backend's gradients (serialized)."""
    from hilbert_hpc.core.patterns import parse_patterns
    from hilbert_hpc.study.jobfile import Case
    from hilbert_hpc.study.measure import dout_shard, shard_inputs
    from hilbert_hpc.study.setup import check_case

    case = Case(case_id="0000-g", name="g", grid=(64,), patterns=tuple(parse_patterns(patterns)), heads=4,
                head_dim=8, dtype=dtype, causal=causal, backend="numpy", pass_="forward+backward")
    setup = check_case(case)
    inputs = shard_inputs(case, 7, setup.layout, _OneRank(), 0)
    dout = np.zeros_like(inputs[0]) if zero_dout else dout_shard(setup, 7, _OneRank(), 0)
    be = setup.backend
    out, lse = be.serialized_forward(*inputs, case.patterns, case.causal, case.softmax_scale)
    grads = list(be.serialized_backward(*inputs, out, lse, dout, case.patterns, case.causal, case.softmax_scale))
    return setup, inputs, dout, out, grads


class _OneRank:
    def Get_rank(self) -> int:
        return 0


def _judged(setup, out, grads) -> dict:
    """The case's accuracy verdict (``measure.judge_accuracy``) of ``out`` and ``grads``, 16 sampled rows."""
    from hilbert_hpc.study.gradients import gradient_accuracy
    from hilbert_hpc.study.measure import judge_accuracy, local_accuracy

    part = local_accuracy(setup.case, 7, 16, out, setup.layout, 0)
    part.update(nonfinite=0, grads=gradient_accuracy(setup, 7, 16, grads))
    return judge_accuracy(setup.case, [part])


def test_an_all_zero_output_gradient_is_within_tolerance(monkeypatch):
    """dO = 0: every gradient and every term is exactly 0."""
    from hilbert_hpc.study import reference_inputs

    made = reference_inputs.random_rows

    def zero_dout(seed, name, *args, **kwargs):
        rows = made(seed, name, *args, **kwargs)
        return rows * 0 if name == "do" else rows

    monkeypatch.setattr(reference_inputs, "random_rows", zero_dout)
    setup, _, _, out, grads = _setup_and_gradients([(16, 1), (64, 4)], zero_dout=True)
    assert not any(np.any(g) for g in grads)
    acc = _judged(setup, out, grads)
    assert acc["within_tolerance"] and all(acc[f"grad_{t}_max_rel_err"] == 0.0 for t in "qkv")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_backward_that_drops_delta_is_caught_where_the_exact_gradient_is_zero(dtype, capsys):
    """The degenerate pattern with dS = Pr dP (Delta forgotten): dQ = scale (dO . V) K instead of 0."""
    setup, (q, k, v), dout, out, grads = _setup_and_gradients([(4, 4)], dtype)
    assert _judged(setup, out, grads)["within_tolerance"]
    selected = (np.arange(64)[:, None] % 4) == np.arange(4)[None, :]              # (row, head): row mod 4 == head
    wrong = setup.case.softmax_scale * (dout * v).sum(axis=-1, keepdims=True) * k * selected[..., None]
    acc = _judged(setup, out, [wrong.astype(grads[0].dtype), *grads[1:]])
    assert not acc["within_tolerance"] and acc["grad_q_max_rel_err"] > 0.1
    assert acc["grad_k_max_rel_err"] <= acc["tolerance"] and acc["grad_v_max_rel_err"] <= acc["tolerance"]
    assert "exceeds the" in capsys.readouterr().err.split("(dQ)")[1]


@pytest.mark.parametrize("tensor", [0, 1, 2])
def test_a_gradient_one_percent_off_is_caught(tensor, capsys):
    setup, _, _, out, grads = _setup_and_gradients([(16, 1), (64, 4)], "float32", causal=True)
    assert _judged(setup, out, grads)["within_tolerance"]
    grads[tensor] = grads[tensor] * np.float32(1.01)
    capsys.readouterr()
    acc = _judged(setup, out, grads)
    name = "qkv"[tensor]
    assert not acc["within_tolerance"] and acc[f"grad_{name}_max_rel_err"] > 10 * acc["tolerance"]
    assert f"({'d' + name.upper()})" in capsys.readouterr().err


@pytest.mark.parametrize("causal", [False, True])
def test_the_terms_are_the_root_sum_square_of_the_definitions_terms(causal):
    """``reference_gradient_check``'s terms against the dense definition of one full pattern."""
    from hilbert_hpc.core.patterns import parse_patterns
    from hilbert_hpc.core.reference_backward import reference_gradient_check

    n, heads, d, scale = 24, 2, 4, 0.4
    rng = np.random.default_rng(3)
    x = {t: rng.standard_normal((n, heads, d)) for t in ("q", "k", "v", "do")}
    rows = np.array([0, 5, 17, 23])
    _, (tq, tk, tv) = reference_gradient_check(rows, source=lambda t, p: x[t][p], heads=heads,
                                               patterns=parse_patterns([(n, 1)]), causal=causal, scale=scale)
    for h in range(heads):
        q, k, v, do = (x[t][:, h] for t in ("q", "k", "v", "do"))
        s = scale * q @ k.T
        if causal:
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        pr = np.exp(s - s.max(axis=1, keepdims=True))
        pr /= pr.sum(axis=1, keepdims=True)
        dp, delta = do @ v.T, (do * (pr @ v)).sum(axis=1, keepdims=True)
        parts = pr ** 2 * (dp ** 2 + delta ** 2)
        assert np.allclose(tq[:, h], scale * np.sqrt(parts @ k ** 2)[rows], rtol=1e-12)
        assert np.allclose(tk[:, h], scale * np.sqrt(parts.T @ q ** 2)[rows], rtol=1e-12)
        assert np.allclose(tv[:, h], np.sqrt((pr ** 2).T @ do ** 2)[rows], rtol=1e-12)


def test_the_relative_errors_use_the_larger_of_reference_and_terms():
    from hilbert_hpc.study.error_sums import combined, error_sums, relative_errors

    ref, terms = np.array([[1e-16, 0.0]]), np.array([[2.0, 1.0]])
    got = np.array([[3e-16, 1e-16]])
    sums = combined([error_sums(got, ref, terms), error_sums(np.empty((0, 2)), np.empty((0, 2)), np.empty((0, 2)))])
    max_rel, rel_l2 = relative_errors(sums)
    assert max_rel == pytest.approx(2e-16 / 2.0) and rel_l2 == pytest.approx(math.hypot(2e-16, 1e-16) / math.sqrt(5))
    forward = error_sums(np.array([[1.5]]), np.array([[1.0]]))                    # no terms: against the reference
    assert relative_errors(forward) == (pytest.approx(0.5), pytest.approx(0.5))


# --- the run table -----------------------------------------------------------------------------------------------

MIXED = JobSpec({"name": "mixed", "repeats": 2, "warmup": 0, "accuracy_rows": 4},
                defaults={"heads": 2, "head_dim": 8, "backend": "numpy", "dtype": "float32"},
                cases=[{"name": "m", "grid": [16, 16], "patterns": [[64, 1], [256, 4]],
                        "sweep": {"pass": ["forward", "forward+backward"]}}])


def _table(text: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The run table's column titles and its rows by case id, cell by title (widths from the rule)."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("case "))
    head, rule = lines[at], lines[at + 1]
    spans, pos = [], 0
    for dashes in rule.split("  "):
        spans.append((pos, pos + len(dashes)))
        pos += len(dashes) + 2
    titles = [head[a:b].strip() for a, b in spans]
    rows = {}
    for line in lines[at + 2:]:
        cells = [line[a:b].strip() for a, b in spans]
        rows[cells[0]] = dict(zip(titles, cells))
    return titles, rows


def test_the_run_table_of_a_forward_backward_job_shows_backward_time_and_gradient_error(tmp_path):
    path, text, _ = _run(tmp_path, MIXED)
    titles, rows = _table(text)
    assert titles.index("attn ms") < titles.index("bwd ms") < titles.index("total ms")
    assert titles.index("max rel err") < titles.index("grad rel err")
    with h5py.File(path) as f:
        for cid, g in f["cases"].items():
            row, met, acc = rows[cid], g["metrics"].attrs, g["accuracy"].attrs
            if g.attrs["pass"] == "forward":
                assert row["bwd ms"] == "-" and row["grad rel err"] == "-"
                continue
            assert row["bwd ms"] == f"{met['median_backward_s'] * 1e3:.2f}" and float(row["bwd ms"]) > 0
            worst = max(acc[f"grad_{t}_max_rel_err"] for t in "qkv")
            assert row["grad rel err"] == f"{worst:.1e}" and worst <= acc["tolerance"]


def test_a_forward_job_table_has_no_backward_columns(tmp_path):
    _, text, _ = _run(tmp_path, MIXED.but(cases=[{"name": "f", "grid": [16, 16], "patterns": [[64, 1]]}]))
    titles, rows = _table(text)
    assert "bwd ms" not in titles and "grad rel err" not in titles and len(rows) == 1


# --- the scaling plots -------------------------------------------------------------------------------------------

def _study(tmp_path, scaling: str) -> list[dict]:
    """Four forward+backward series and one forward-only series on 1, 2, 4 and 8 ranks: the report's rows."""
    from test_report import make_case, run_report, timings, write_results

    rng = np.random.default_rng(36)
    cases = []
    for p in (1, 2, 4, 8):
        grow = {"tokens": 4096 * p, "grid": [64, 64 * p]} if scaling == "weak" else {}
        for g in range(4):
            cases.append(make_case(f"b{g}-{p}", timings(rng, p, 0.1 / p), name=f"b{g}", scaling=scaling,
                                   counters={"backward": timings(rng, p, 0.25 / p ** 0.8)}, **grow,
                                   **{"pass": "forward+backward"}))
        cases.append(make_case(f"f-{p}", timings(rng, p, 0.1 / p), name="f", scaling=scaling, **grow))
    tables, _ = run_report([write_results(tmp_path / f"{scaling}.h5", cases)])
    return tables[f"{scaling}_scaling"]


@pytest.mark.parametrize("scaling", ["strong", "weak"])
def test_a_forward_backward_plot_has_a_row_of_panels_per_pass(tmp_path, scaling):
    pytest.importorskip("matplotlib")
    from hilbert_hpc.study.report_files import scaling_figure

    rows = _study(tmp_path, scaling)
    groups = list(dict.fromkeys(r["group"] for r in rows))
    backward = [g for g in groups if any("backward_s" in r for r in rows if r["group"] == g)]
    assert len(groups) == 5 and len(backward) == 4
    fig = scaling_figure(rows, scaling, "efficiency", True)
    assert len(fig.axes) == 6
    for (ax_t, ax_e), what in zip(np.reshape(fig.axes, (3, 2)), ("forward", "backward", "forward+backward")):
        assert ax_t.get_title() == f"{scaling}: {what}" and ax_e.get_title() == f"efficiency: {what}"
        drawn = groups if what == "forward" else backward
        assert [bars.get_label() for bars in ax_t.containers] == drawn             # the times, with their range
        measured = [bars.lines[0] for bars in ax_t.containers]
        ideal = [line for line in ax_t.get_lines() if line.get_label().endswith(" (ideal)")]
        assert [line.get_label() for line in ideal] == [f"{g} (ideal)" for g in drawn]
        assert all(line.get_linestyle() == "-" and line.get_marker() not in ("", "None") for line in measured)
        assert all(line.get_linestyle() == "--" and line.get_marker() in ("", "None") for line in ideal)
        assert {line.get_color() for line in ideal} == {line.get_color() for line in measured}
        assert len({line.get_color() for line in measured}) == len(drawn)
        assert len(ax_e.get_lines()) == len(drawn) + 1                           # with the line at 1.0
        assert ax_t.get_legend() is None and ax_e.get_legend() is None
    (box,) = fig.legends                                                         # one legend, below the panels
    assert [t.get_text() for t in box.get_texts()] == groups
