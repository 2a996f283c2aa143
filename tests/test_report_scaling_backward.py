"""Strong and weak scaling of the backward and of forward+backward in the report, its CSV and plots, and the
backward ring's counters in the compute / communication table; forward-only reports keep their columns."""

from __future__ import annotations

import csv

import h5py
import numpy as np
import pytest

from test_report import make_case, run_report, timings, write_results

BOTH = "forward+backward"
RING_BACKWARD = ("backward_local_s", "backward_compute_s", "backward_wait_s", "backward_pack_s",
                 "backward_imbalance_s", "backward_bytes_sent")

#: the forward's columns of the scaling rows, in order: what a forward-only report had before the backward's
STRONG_KEYS = ["group", "case", "file", "ranks", "attention_s", "attention_min_s", "attention_max_s", "ideal_s",
               "speedup", "efficiency", "speedup_min", "speedup_max", "noise"]
WEAK_KEYS = ["group", "case", "file", "ranks", "tokens", "attention_s", "attention_min_s", "attention_max_s",
             "ideal_s", "efficiency", "efficiency_min", "efficiency_max", "noise"]


def _slowest(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).max(axis=0)


def _counters(rng: np.random.Generator, ranks: int, backward: np.ndarray, ring: bool = True) -> dict:
    """A forward+backward case's timings beside the forward's: the backward and, with ``ring``, the backward
    ring's counters (zero on one rank, as a run records them)."""
    out = {"backward": backward}
    if ring:
        for name in RING_BACKWARD:
            out[name] = np.zeros_like(backward) if ranks == 1 else backward * rng.uniform(0.1, 0.3, backward.shape)
    return out


@pytest.fixture
def study(tmp_path):
    """Strong (1, 2, 4 ranks) and weak (1, 2, 4 ranks) forward+backward series, and a forward-only strong one."""
    rng = np.random.default_rng(40)
    att, bwd, cases = {}, {}, []
    for p in (1, 2, 4):
        att[f"s{p}"], bwd[f"s{p}"] = timings(rng, p, 0.1 / p ** 0.9), timings(rng, p, 0.25 / p ** 0.7)
        cases.append(make_case(f"s{p}", att[f"s{p}"], counters=_counters(rng, p, bwd[f"s{p}"]), **{"pass": BOTH}))
        att[f"w{p}"], bwd[f"w{p}"] = timings(rng, p, 0.1 * p ** 0.1), timings(rng, p, 0.25 * p ** 0.2)
        cases.append(make_case(f"w{p}", att[f"w{p}"], counters=_counters(rng, p, bwd[f"w{p}"]), scaling="weak",
                               tokens=4096 * p, grid=[64, 64 * p], **{"pass": BOTH}))
        att[f"f{p}"] = timings(rng, p, 0.1 / p)
        cases.append(make_case(f"f{p}", att[f"f{p}"], name="fwd"))
    return write_results(tmp_path / "s.h5", cases), att, bwd


def _check_ratio(row: dict, prefix: str, ref: np.ndarray, case: np.ndarray, name: str) -> None:
    """``row``'s ``{prefix}{name}`` and its range: median, min, max of the slowest rank's ``ref`` / ``case``."""
    r, c = _slowest(ref), _slowest(case)
    assert row[f"{prefix}{name}"] == pytest.approx(np.median(r) / np.median(c))
    assert row[f"{prefix}{name}_min"] == pytest.approx(r.min() / c.max())
    assert row[f"{prefix}{name}_max"] == pytest.approx(r.max() / c.min())


def test_strong_scaling_of_the_backward_and_of_forward_backward(study):
    path, att, bwd = study
    tables, _ = run_report([path])
    rows = {r["case"]: r for r in tables["strong_scaling"]}
    assert set(rows) == {"s1", "s2", "s4", "f1", "f2", "f4"}
    for p in (1, 2, 4):
        row = rows[f"s{p}"]
        for prefix, ref, case in (("backward_", bwd["s1"], bwd[f"s{p}"]),
                                  ("forward_backward_", att["s1"] + bwd["s1"], att[f"s{p}"] + bwd[f"s{p}"])):
            _check_ratio(row, prefix, ref, case, "speedup")
            assert row[f"{prefix}efficiency"] == pytest.approx(row[f"{prefix}speedup"] / p)
            assert row[f"{prefix}ideal_s"] == pytest.approx(np.median(_slowest(ref)) / p)
            t = _slowest(case)
            assert (row[f"{prefix}s"], row[f"{prefix}min_s"], row[f"{prefix}max_s"]) == (
                pytest.approx(np.median(t)), pytest.approx(t.min()), pytest.approx(t.max()))
            assert row[f"{prefix}noise"] == ("" if p == 1 else "resolved")
        _check_ratio(row, "", att["s1"], att[f"s{p}"], "speedup")         # the forward's as before
    for p in (1, 2, 4):
        assert list(rows[f"f{p}"]) == STRONG_KEYS                          # a forward series: no backward keys


def test_weak_scaling_of_the_backward_and_of_forward_backward(study):
    path, att, bwd = study
    tables, _ = run_report([path])
    rows = {r["case"]: r for r in tables["weak_scaling"]}
    assert set(rows) == {"w1", "w2", "w4"}
    for p in (1, 2, 4):
        row = rows[f"w{p}"]
        for prefix, ref, case in (("backward_", bwd["w1"], bwd[f"w{p}"]),
                                  ("forward_backward_", att["w1"] + bwd["w1"], att[f"w{p}"] + bwd[f"w{p}"])):
            _check_ratio(row, prefix, ref, case, "efficiency")
            assert row[f"{prefix}ideal_s"] == pytest.approx(np.median(_slowest(ref)))
            assert f"{prefix}speedup" not in row
        assert list(row)[:len(WEAK_KEYS)] == WEAK_KEYS


def test_the_scaling_tables_print_the_backward_columns_only_for_its_series(study):
    path, _, _ = study
    _, text = run_report([path])
    strong = text[text.index("strong scaling ("):text.index("weak scaling (")]
    header = strong.splitlines()[1]
    for title in ("bwd ms", "bwd speedup", "bwd effic.", "f+b ms", "f+b speedup", "f+b effic."):
        assert title in header, title
    assert "bwd speedup range" not in header
    (key,) = [line.split()[0] for line in strong.splitlines() if line.split()[2:3] == ["fwd"]]   # "gN = fwd ..."
    fwd_lines = [line for line in strong.splitlines()[3:] if line.startswith(f"{key} ")]
    assert len(fwd_lines) == 3 and all(line.split()[-6:] == ["-"] * 6 for line in fwd_lines)
    weak = text[text.index("weak scaling ("):]
    assert "f+b effic." in weak.splitlines()[1] and "bwd speedup" not in weak.splitlines()[1]
    _, wide = run_report([path], wide=True)
    for title in ("bwd ms [min, max]", "bwd ideal ms", "bwd speedup range", "fwd+bwd vs spread",
                  "fwd+bwd efficiency range"):
        assert title in wide, title


def test_forward_only_scaling_reports_keep_their_columns(tmp_path):
    rng = np.random.default_rng(41)
    cases = [make_case(f"s{p}", timings(rng, p, 1.0 / p)) for p in (1, 2, 4)]
    cases += [make_case(f"w{p}", timings(rng, p, 0.1), scaling="weak", tokens=4096 * p, grid=[64, 64 * p])
              for p in (1, 2, 4)]
    for wide in (False, True):
        tables, text = run_report([write_results(tmp_path / f"f{wide}.h5", cases)], wide=wide)
        assert "bwd" not in text and "f+b" not in text and "backward" not in text
        assert [list(r) for r in tables["strong_scaling"]] == [STRONG_KEYS] * 3
        assert [list(r) for r in tables["weak_scaling"]] == [WEAK_KEYS] * 3


def test_the_csv_holds_the_backward_scaling_columns(study, tmp_path):
    path, _, _ = study
    tables, _ = run_report([path], csv_path=tmp_path / "r.csv")
    with open(tmp_path / "r.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    strong = {r["case"]: r for r in rows if r["table"] == "strong_scaling"}
    want = {r["case"]: r for r in tables["strong_scaling"]}
    for key in ("backward_speedup", "backward_efficiency", "forward_backward_speedup_min",
                "forward_backward_efficiency"):
        assert float(strong["s4"][key]) == pytest.approx(want["s4"][key])
        assert strong["f4"][key] == ""
    weak = {r["case"]: r for r in rows if r["table"] == "weak_scaling"}
    assert float(weak["w2"]["backward_efficiency_max"]) > 0 and weak["w2"]["backward_noise"] == "resolved"


def test_a_superlinear_backward_efficiency_gets_a_note(tmp_path):
    rng = np.random.default_rng(42)
    att = {p: np.full((p, 3), 1.0 / p) * [1.0, 1.01, 1.02] for p in (1, 2)}
    bwd = {1: np.full((1, 3), 1.0) * [1.0, 1.01, 1.02], 2: np.full((2, 3), 0.2) * [1.0, 1.01, 1.02]}
    cases = [make_case(f"s{p}", att[p], counters=_counters(rng, p, bwd[p]), **{"pass": BOTH}) for p in (1, 2)]
    tables, text = run_report([write_results(tmp_path / "n.h5", cases)])
    (row,) = [r for r in tables["strong_scaling"] if r["ranks"] == 2]
    assert row["backward_efficiency"] == pytest.approx(2.5) and row["efficiency"] == pytest.approx(1.0)
    assert any("P=2: backward efficiency 2.5 is implausibly superlinear" in n for n in tables["notes"])
    assert any("P=2: forward+backward efficiency" in n for n in tables["notes"])
    assert not any("P=2: efficiency" in n for n in tables["notes"])
    assert "2.50!" in text


def test_the_plots_are_written_for_a_forward_backward_study(study, tmp_path):
    """The panels of each pass: tests/test_gradcheck_table_trust.py."""
    pytest.importorskip("matplotlib")
    path, _, _ = study
    tables, _ = run_report([path], plot_dir=tmp_path / "plots")
    assert sorted(p.rsplit("/", 1)[-1] for p in tables["plots"]) == ["accuracy_ranks.png", "strong_scaling.png",
                                                                     "weak_scaling.png"]


def test_forward_only_plots_are_drawn_as_before(tmp_path):
    pytest.importorskip("matplotlib")
    from hilbert_hpc.study.report_files import scaling_figure

    rng = np.random.default_rng(43)
    cases = [make_case(f"s{p}", timings(rng, p, 1.0 / p)) for p in (1, 2, 4)]
    tables, _ = run_report([write_results(tmp_path / "f.h5", cases)])
    fig = scaling_figure(tables["strong_scaling"], "strong", "efficiency", True)
    ax_t, ax_e = fig.axes
    (group,) = {r["group"] for r in tables["strong_scaling"]}
    assert [t.get_text() for box in fig.legends for t in box.get_texts()] == [group]   # no curve kinds
    assert len(ax_e.get_lines()) == 2 and ax_t.get_ylabel().startswith("attention time, s")


def test_compute_communication_shows_the_backward_ring(study, tmp_path):
    path, _, bwd = study
    tables, text = run_report([path])
    rows = {r["case"]: r for r in tables["compute_communication"]}
    assert set(rows) == {"s2", "s4", "w2", "w4", "f2", "f4"}                # one rank: no ring
    with h5py.File(path) as f:
        wait = f["cases/s4/timings/backward_wait_s"][()]
    assert rows["s4"]["backward_wait_s"] == pytest.approx(np.median(_slowest(wait)))
    assert rows["s4"]["backward_s"] == pytest.approx(np.median(_slowest(bwd["s4"])))
    assert rows["s4"]["backward_wait_share"] == pytest.approx(rows["s4"]["backward_wait_s"] / rows["s4"]["backward_s"])
    assert all(f"backward_{n}" in rows["s2"] for n in ("local_s", "compute_s", "pack_s", "imbalance_s"))
    assert "backward_wait_s" not in rows["f4"]
    table = text[text.index("compute / communication"):]
    header = table.splitlines()[1]
    assert "bwd comp. ms" in header and "bwd wait ms" in header and "bwd wait share" in header
    _, wide = run_report([path], wide=True)
    assert "bwd imbalance ms" in wide and "bwd pack ms" in wide


def test_files_without_the_backward_ring_counters_are_still_read(tmp_path):
    """A forward+backward file written before the backward ring's counters were recorded: the scaling
    columns of the backward, no backward ring columns."""
    rng = np.random.default_rng(44)
    cases = [make_case(f"s{p}", timings(rng, p, 0.1 / p),
                       counters=_counters(rng, p, timings(rng, p, 0.3 / p), ring=False), **{"pass": BOTH})
             for p in (1, 2)]
    tables, text = run_report([write_results(tmp_path / "old.h5", cases)])
    (row,) = tables["compute_communication"]
    assert "backward_wait_s" not in row and "bwd wait" not in text
    assert all("backward_speedup" in r for r in tables["strong_scaling"])
