"""The report of forward+backward cases: backward and forward+backward times, useful TFLOP/s and peer ratios
beside the forward's; forward-only files keep their tables."""

from __future__ import annotations

import csv

import h5py
import numpy as np
import pytest

from test_report import make_case, run_report, slowest_median, timings, write_results

BOTH = "forward+backward"


def _with_backward(path: str, backward: dict[str, np.ndarray], grad_errors: dict[str, float]) -> None:
    """Add the backward's timings and gradient errors to cases of a file written by ``write_results``."""
    with h5py.File(path, "r+") as f:
        for cid, values in backward.items():
            g = f["cases"][cid]
            g["timings"]["backward"] = values
            for t in "qkv":
                g["accuracy"].attrs[f"grad_{t}_max_rel_err"] = grad_errors.get(t, 1e-7)


@pytest.fixture
def mixed(tmp_path):
    rng = np.random.default_rng(30)
    att = {cid: timings(rng, 1, scale) for cid, scale in (("fwd", 0.1), ("both", 0.1), ("peer", 0.3),
                                                             ("peer-fwd", 0.3))}
    bwd = {"both": timings(rng, 1, 0.25), "peer": timings(rng, 1, 0.5)}
    cases = [make_case("fwd", att["fwd"], backend="cuda", flops=3e12),
             make_case("both", att["both"], backend="cuda", flops=3e12, **{"pass": BOTH}),
             make_case("peer", att["peer"], backend="torch", flops=3e12, **{"pass": BOTH}),
             make_case("peer-fwd", att["peer-fwd"], backend="torch", flops=3e12)]
    path = write_results(tmp_path / "m.h5", cases)
    _with_backward(path, bwd, {"k": 3e-6})
    return path, att, bwd


def test_cases_show_backward_and_forward_backward_times_and_throughput(mixed):
    path, att, bwd = mixed
    tables, text = run_report([path])
    rows = {r["case"]: r for r in tables["cases"]}
    both = rows["both"]
    assert both["attention_s"] == pytest.approx(slowest_median(att["both"]))
    assert both["backward_s"] == pytest.approx(slowest_median(bwd["both"]))
    per_rep = (att["both"] + bwd["both"]).max(axis=0)
    assert both["forward_backward_s"] == pytest.approx(np.median(per_rep))
    assert (both["forward_backward_min_s"], both["forward_backward_max_s"]) == (pytest.approx(per_rep.min()),
                                                                                pytest.approx(per_rep.max()))
    assert both["backward_tflops"] == pytest.approx(2.5 * 3e12 / both["backward_s"] / 1e12)
    assert both["forward_backward_tflops"] == pytest.approx(3.5 * 3e12 / both["forward_backward_s"] / 1e12)
    assert both["grad_max_rel_err"] == 3e-6
    assert "backward_s" not in rows["fwd"] and "backward_s" not in rows["peer-fwd"]
    header = text.splitlines()[3]
    for title in ("bwd ms", "bwd TFLOP/s", "f+b ms", "f+b TFLOP/s", "grad err"):
        assert title in header, title
    fwd_line = next(line for line in text.splitlines() if line.startswith("fwd "))
    assert fwd_line.split()[-5:] == ["-"] * 5
    _, wide = run_report([path], wide=True)
    assert "bwd ms [min, max]" in wide and "fwd+bwd ms [min, max]" in wide and "max grad rel err" in wide


def test_the_peer_table_compares_backward_and_forward_backward_with_the_peer(mixed):
    path, att, bwd = mixed
    tables, text = run_report([path])
    rows = {r["case"]: r for r in tables["peer_ratio"]}
    assert rows["both"]["peer_case"] == "peer" and rows["fwd"]["peer_case"] == "peer-fwd"
    both = rows["both"]
    assert both["ratio"] == pytest.approx(slowest_median(att["peer"]) / slowest_median(att["both"]))
    assert both["backward_ratio"] == pytest.approx(slowest_median(bwd["peer"]) / slowest_median(bwd["both"]))
    assert both["forward_backward_ratio"] == pytest.approx(
        slowest_median(att["peer"] + bwd["peer"]) / slowest_median(att["both"] + bwd["both"]))
    assert both["backward_noise"] in ("resolved", "within noise")
    assert "backward_ratio" not in rows["fwd"]
    peer_text = text[text.index("peers: torch, flash"):]
    assert "bwd ratio" in peer_text and "fwd+bwd ratio" in peer_text
    _, wide = run_report([path], wide=True)
    assert "peer bwd ms" in wide and "fwd+bwd ratio range" in wide


def test_the_csv_holds_the_backward_columns(mixed, tmp_path):
    path, _, _ = mixed
    run_report([path], csv_path=tmp_path / "r.csv")
    with open(tmp_path / "r.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f)]
    cases = {r["case"]: r for r in rows if r["table"] == "cases"}
    assert float(cases["both"]["forward_backward_tflops"]) > 0 and cases["fwd"]["backward_s"] == ""
    peers = {r["case"]: r for r in rows if r["table"] == "peer_ratio"}
    assert float(peers["both"]["backward_ratio"]) > 0 and peers["fwd"]["backward_ratio"] == ""


def test_forward_only_reports_have_no_backward_column(tmp_path):
    rng = np.random.default_rng(31)
    path = write_results(tmp_path / "f.h5", [make_case("a", timings(rng, 1, 0.1)),
                                             make_case("p", timings(rng, 1, 0.2), backend="torch", heads=4)])
    for wide in (False, True):
        tables, text = run_report([path], wide=wide)
        assert "bwd" not in text and "grad" not in text
    assert not any("backward_s" in r for r in tables["cases"] + tables["peer_ratio"])


def test_each_peer_gets_its_row(tmp_path):
    rng = np.random.default_rng(32)
    att = {cid: timings(rng, 1, scale) for cid, scale in (("ours", 0.1), ("t", 0.3), ("f", 0.2))}
    path = write_results(tmp_path / "p.h5", [make_case("ours", att["ours"], backend="cuda"),
                                             make_case("f", att["f"], backend="flash"),
                                             make_case("t", att["t"], backend="torch")])
    tables, text = run_report([path])
    rows = [(r["case"], r["peer_backend"], r["peer_case"]) for r in tables["peer_ratio"]]
    assert rows == [("ours", "torch", "t"), ("ours", "flash", "f")]
    flash = tables["peer_ratio"][1]
    assert flash["ratio"] == pytest.approx(slowest_median(att["f"]) / slowest_median(att["ours"]))
    assert " peer " in text[text.index("peers: torch, flash"):].splitlines()[1]
