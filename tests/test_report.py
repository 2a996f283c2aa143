"""The report over results files: statistics recomputed from raw timings, scaling, ratios, CSV, plots, errors."""

from __future__ import annotations

import csv
import io
import json
import math
import sys

import h5py
import numpy as np
import pytest

from hilbert_hpc.errors import UserError
from hilbert_hpc.report import report

BASE = {"name": "g", "tokens": 4096, "grid": [64, 64], "patterns": [[256, 1], [4096, 16]], "batch": 1, "heads": 4,
        "head_dim": 32, "causal": False, "ordering": "natural", "segment": 0, "dtype": "float32",
        "backend": "numpy", "scale": 0.17677669529663687, "transport": "auto", "input": ""}


def make_case(cid: str, attention: np.ndarray, *, complete: bool = True, json_ranks: bool = True,
              total: np.ndarray | None = None, flops: float = 2e9, counters: dict | None = None, **params) -> dict:
    """A case description for write_results: parameters, raw (ranks, repeats) timings and flags."""
    attention = np.asarray(attention, dtype=np.float64)
    p = dict(BASE, ranks=attention.shape[0], scaling="strong")
    p.update(params)
    return {"id": cid, "params": p, "attention": attention, "complete": complete, "json_ranks": json_ranks,
            "total": attention * 1.5 if total is None else np.asarray(total, dtype=np.float64), "flops": flops,
            "counters": counters or {}}


def write_results(path, cases: list[dict], program: str = "hilbert-hpc") -> str:
    """A results file in the layout of docs/results.md with the given cases."""
    with h5py.File(path, "w") as f:
        if program:
            f.attrs["program"] = program
        f.attrs["version"] = "0.1.0"
        root = f.create_group("cases")
        for c in cases:
            g = root.create_group(c["id"])
            params = dict(c["params"])
            if not c["json_ranks"]:
                params.pop("ranks")
                params.pop("scaling")
            g.attrs["params_json"] = json.dumps(params, sort_keys=True)
            for key, value in c["params"].items():
                g.attrs[key] = json.dumps(value) if isinstance(value, list) and value and \
                    isinstance(value[0], list) else value
            g.attrs["ranks"] = c["params"]["ranks"]
            t = g.create_group("timings")
            t["attention"] = c["attention"]
            t["total"] = c["total"]
            t["serialize"] = c["attention"] * 0.1
            for name, values in c["counters"].items():
                t[name] = np.asarray(values, dtype=np.float64)
            g.create_group("metrics").attrs["useful_flops"] = c["flops"]
            g["metrics"].attrs["useful_tflops"] = 123.0  # deliberately wrong: the report recomputes
            acc = g.create_group("accuracy")
            acc.attrs["max_rel_err"] = 1e-6
            acc.attrs["rel_l2_err"] = 1e-7
            if c["complete"]:
                g.attrs["complete"] = True
    return str(path)


def slowest_median(a: np.ndarray) -> float:
    return float(np.median(np.asarray(a).max(axis=0)))


def timings(rng: np.random.Generator, ranks: int, scale: float, repeats: int = 5) -> np.ndarray:
    return scale * (1.0 + 0.2 * rng.random((ranks, repeats)))


def run_report(paths, **kw) -> tuple[dict, str]:
    out = io.StringIO()
    tables = report(paths, stream=out, **kw)
    return tables, out.getvalue()


def test_cases_table_recomputes_statistics(tmp_path):
    rng = np.random.default_rng(0)
    att = timings(rng, 2, 0.1)
    tot = att + 0.05 * rng.random(att.shape)
    path = write_results(tmp_path / "a.h5", [make_case("0000-g", att, total=tot, flops=3e12, batch=2)])
    tables, text = run_report([path])
    (row,) = tables["cases"]
    per_rep = att.max(axis=0)
    assert row["attention_s"] == pytest.approx(np.median(per_rep))
    assert (row["attention_min_s"], row["attention_max_s"]) == (pytest.approx(per_rep.min()),
                                                                pytest.approx(per_rep.max()))
    assert row["total_s"] == pytest.approx(slowest_median(tot))
    assert row["tokens_per_s"] == pytest.approx(4096 * 2 / slowest_median(tot))
    assert row["tflops"] == pytest.approx(3e12 / np.median(per_rep) / 1e12)
    assert row["ranks"] == 2 and row["file"] == path and row["max_rel_err"] == 1e-6
    assert "0000-g" in text and "TFLOP/s" in text
    assert "strong scaling" not in text and tables["strong_scaling"] == []


def test_strong_scaling_speedup_and_efficiency(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {p: timings(rng, p, 1.0 / p ** 0.8) for p in (1, 2, 4, 8)}
    cases = [make_case(f"000{i}-g", a) for i, a in enumerate(arrays.values())]
    cases.append(make_case("0009-other", timings(rng, 2, 0.3), name="other"))  # only one rank count: no group
    tables, text = run_report([write_results(tmp_path / "s.h5", cases)])
    rows = tables["strong_scaling"]
    assert [r["ranks"] for r in rows] == [1, 2, 4, 8]
    assert len({r["group"] for r in rows}) == 1 and "g numpy natural auto N=4096" in rows[0]["group"]
    t0 = slowest_median(arrays[1])
    for r in rows:
        t = slowest_median(arrays[r["ranks"]])
        assert r["attention_s"] == pytest.approx(t)
        assert r["speedup"] == pytest.approx(t0 / t)
        assert r["efficiency"] == pytest.approx(t0 / t / r["ranks"])
        assert r["ideal_s"] == pytest.approx(t0 / r["ranks"])
    assert "strong scaling" in text and "weak scaling" not in text


def test_strong_scaling_base_is_the_fewest_ranks_and_groups_split_on_other_params(tmp_path):
    rng = np.random.default_rng(2)
    arrays = {(p, c): timings(rng, p, 1.0 / p) for p in (2, 4) for c in (False, True)}
    cases = [make_case(f"{p}{int(c)}", a, causal=c) for (p, c), a in arrays.items()]
    tables, _ = run_report([write_results(tmp_path / "s.h5", cases)])
    rows = tables["strong_scaling"]
    assert len(rows) == 4 and len({r["group"] for r in rows}) == 2
    assert all("causal=" in r["group"] for r in rows)
    for r in rows:
        causal = "causal=true" in r["group"].lower()
        t2, t = slowest_median(arrays[(2, causal)]), slowest_median(arrays[(r["ranks"], causal)])
        assert r["speedup"] == pytest.approx(t2 / t)
        assert r["efficiency"] == pytest.approx(t2 / t * 2 / r["ranks"])


def test_weak_scaling_efficiency(tmp_path):
    rng = np.random.default_rng(3)
    grids = {1: [64, 64], 2: [64, 128], 4: [128, 128]}
    arrays = {p: timings(rng, p, 0.1 * (1 + 0.1 * p)) for p in grids}
    cases = [make_case(f"w{p}", arrays[p], scaling="weak", grid=g, tokens=math.prod(g),
                       patterns=[[256, 1], [math.prod(g), 16]]) for p, g in grids.items()]
    tables, text = run_report([write_results(tmp_path / "w.h5", cases)])
    rows = tables["weak_scaling"]
    assert tables["strong_scaling"] == [] and [r["ranks"] for r in rows] == [1, 2, 4]
    t0 = slowest_median(arrays[1])
    for r in rows:
        assert r["efficiency"] == pytest.approx(t0 / slowest_median(arrays[r["ranks"]]))
        assert r["tokens"] == 4096 * r["ranks"]
    assert "weak scaling" in text


def test_hilbert_vs_natural_ratio(tmp_path):
    rng = np.random.default_rng(4)
    nat, hil, seg = (timings(rng, 1, s) for s in (0.2, 0.1, 0.15))
    cases = [make_case("n", nat), make_case("h", hil, ordering="hilbert"),
             make_case("s", seg, ordering="hilbert-segment", segment=256),
             make_case("lonely", hil, ordering="hilbert", name="lonely")]  # no natural partner
    tables, text = run_report([write_results(tmp_path / "o.h5", cases)])
    rows = {r["ordering"]: r for r in tables["hilbert_vs_natural"]}
    assert set(rows) == {"hilbert", "hilbert-segment"}
    assert rows["hilbert"]["ratio"] == pytest.approx(slowest_median(nat) / slowest_median(hil))
    assert rows["hilbert-segment"]["ratio"] == pytest.approx(slowest_median(nat) / slowest_median(seg))
    assert rows["hilbert-segment"]["segment"] == 256 and rows["hilbert"]["natural_case"] == "n"
    assert "hilbert-segment/256" in text


def test_peer_ratio_against_the_torch_case(tmp_path):
    rng = np.random.default_rng(5)
    peer, ring = timings(rng, 1, 0.8), timings(rng, 4, 0.1)
    cases = [make_case("peer", peer, backend="torch"), make_case("ring", ring, backend="cuda-fp32", transport="staged"),
             make_case("nopeer", ring, backend="cupy", heads=8)]
    tables, text = run_report([write_results(tmp_path / "p.h5", cases)])
    (row,) = tables["peer_ratio"]
    ratio = slowest_median(peer) / slowest_median(ring)
    assert row["case"] == "ring" and row["peer_case"] == "peer" and row["ranks"] == 4
    assert row["ratio"] == pytest.approx(ratio) and row["ratio_per_gpu"] == pytest.approx(ratio / 4)
    assert "PyTorch peer" in text


def test_compute_communication_table(tmp_path):
    rng = np.random.default_rng(6)
    att = timings(rng, 2, 0.1, repeats=3)
    counters = {name: rng.random((2, 3)) * 0.01 for name in ("local_s", "compute_s", "wait_s", "pack_s",
                                                               "imbalance_s")}
    cases = [make_case("one", timings(rng, 1, 0.1)), make_case("two", att, counters=counters)]
    tables, _ = run_report([write_results(tmp_path / "c.h5", cases)])
    (row,) = tables["compute_communication"]
    assert row["case"] == "two"
    for name, values in counters.items():
        assert row[name] == pytest.approx(slowest_median(values))
    assert row["wait_share"] == pytest.approx(slowest_median(counters["wait_s"]) / slowest_median(att))


def test_incomplete_cases_are_skipped(tmp_path):
    rng = np.random.default_rng(7)
    cases = [make_case("done", timings(rng, 1, 0.1)), make_case("half", timings(rng, 2, 0.1), complete=False)]
    tables, text = run_report([write_results(tmp_path / "i.h5", cases)])
    assert [r["case"] for r in tables["cases"]] == ["done"]
    assert "1 incomplete case(s) skipped" in text
    assert tables["strong_scaling"] == []


def test_merging_files_pools_cases_and_keeps_the_later_duplicate(tmp_path):
    rng = np.random.default_rng(8)
    p1, p2, p2_again = timings(rng, 1, 1.0), timings(rng, 2, 0.6), timings(rng, 2, 0.5)
    # the same job run on 1 and 2 ranks into separate files; params_json without ranks/scaling (older files)
    a = write_results(tmp_path / "p1.h5", [make_case("0000-g", p1, json_ranks=False)])
    b = write_results(tmp_path / "p2.h5", [make_case("0000-g", p2, json_ranks=False)])
    c = write_results(tmp_path / "p2b.h5", [make_case("0000-g", p2_again, json_ranks=False)])
    tables, text = run_report([a, b, c])
    assert [(r["file"], r["ranks"]) for r in tables["cases"]] == [(a, 1), (c, 2)]
    assert any("keeping the later one" in n and "p2b.h5" in n for n in tables["notes"])
    assert "note:" in text
    rows = tables["strong_scaling"]
    assert [r["ranks"] for r in rows] == [1, 2]
    assert rows[1]["speedup"] == pytest.approx(slowest_median(p1) / slowest_median(p2_again))


def test_csv_holds_every_table_row(tmp_path):
    rng = np.random.default_rng(9)
    cases = [make_case("n1", timings(rng, 1, 0.2)), make_case("h1", timings(rng, 1, 0.1), ordering="hilbert"),
             make_case("n2", timings(rng, 2, 0.1))]
    out = tmp_path / "report.csv"
    tables, text = run_report([write_results(tmp_path / "x.h5", cases)], csv_path=out)
    with out.open(newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        rows = list(reader)
    assert header[0] == "table"
    for name in ("cases", "strong_scaling", "hilbert_vs_natural", "compute_communication"):
        mine = [r for r in rows if r["table"] == name]
        assert len(mine) == len(tables[name]) > 0, name
        for key in tables[name][0]:
            assert key in header
    assert len(rows) == sum(len(v) for k, v in tables.items() if k not in ("notes", "plots"))
    strong = [r for r in rows if r["table"] == "strong_scaling"]
    assert [float(r["speedup"]) for r in strong] == pytest.approx([r["speedup"] for r in tables["strong_scaling"]])
    cases_rows = [r for r in rows if r["table"] == "cases"]
    assert [r["case"] for r in cases_rows] == ["h1", "n1", "n2"] and cases_rows[0]["speedup"] == ""
    assert str(out) in text


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(10)
    strong = [make_case(f"s{p}", timings(rng, p, 1.0 / p)) for p in (1, 2, 4)]
    weak = [make_case(f"w{p}", timings(rng, p, 0.1), scaling="weak", tokens=4096 * p, grid=[64, 64 * p])
            for p in (1, 2, 4)]
    tables, _ = run_report([write_results(tmp_path / "s.h5", strong + weak)], plot_dir=tmp_path / "plots")
    assert sorted(tables["plots"]) == sorted(str(tmp_path / "plots" / n) for n in ("strong_scaling.png",
                                                                                 "weak_scaling.png"))
    for path in tables["plots"]:
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # only the tables with rows get a plot
    tables, _ = run_report([write_results(tmp_path / "t.h5", strong)], plot_dir=tmp_path / "only")
    assert [p.rsplit("/", 1)[-1] for p in tables["plots"]] == ["strong_scaling.png"]


def test_plots_without_matplotlib_ask_for_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = write_results(tmp_path / "a.h5", [make_case("a", np.ones((1, 2)))])
    with pytest.raises(UserError, match="plot"):
        report([path], stream=io.StringIO(), plot_dir=tmp_path / "plots")


def _error(paths) -> str:
    with pytest.raises(UserError) as info:
        report(paths, stream=io.StringIO())
    return str(info.value)


def test_bad_inputs_give_one_user_error_naming_the_file(tmp_path):
    assert "missing.h5" in _error([tmp_path / "missing.h5"]) and "no such file" in _error([tmp_path / "missing.h5"])
    (tmp_path / "garbage.h5").write_bytes(b"\x00garbage, not HDF5\xff" * 50)
    assert "garbage.h5" in _error([tmp_path / "garbage.h5"])
    assert "not an HDF5 file" in _error([tmp_path / "garbage.h5"])
    foreign = write_results(tmp_path / "foreign.h5", [make_case("a", np.ones((1, 2)))], program="")
    assert "foreign.h5" in _error([foreign]) and "not a hilbert-hpc results file" in _error([foreign])
    with h5py.File(tmp_path / "nocases.h5", "w") as f:
        f.attrs["program"] = "hilbert-hpc"
    assert "not a hilbert-hpc results file" in _error([tmp_path / "nocases.h5"])
    empty = write_results(tmp_path / "empty.h5", [make_case("a", np.ones((1, 2)), complete=False)])
    msg = _error([empty])
    assert "empty.h5" in msg and "no complete cases" in msg
    good = write_results(tmp_path / "good.h5", [make_case("a", np.ones((1, 2)))])
    assert "missing.h5" in _error([good, tmp_path / "missing.h5"])
    assert "at least one" in _error([])


def test_report_on_a_real_job(tmp_path):
    from hilbert_hpc.jobfile import load_job
    from hilbert_hpc.mpi import SingleProcessComm
    from hilbert_hpc.runner import run_job

    text = """
[job]
name = "tiny"
repeats = 2
warmup = 0
accuracy_rows = 4
[defaults]
heads = 2
head_dim = 8
dtype = "float64"
[[cases]]
name = "g"
grid = [16, 16]
patterns = [[64, 1], [256, 4]]
[cases.sweep]
ordering = ["natural", "hilbert"]
"""
    job = load_job(tmp_path / "tiny.toml", text=text)
    path = run_job(job, output=str(tmp_path / "tiny.h5"), stream=io.StringIO(), comm=SingleProcessComm())
    tables, out = run_report([path], csv_path=tmp_path / "tiny.csv")
    assert [r["case"] for r in tables["cases"]] == ["0000-g", "0001-g"]
    with h5py.File(path) as f:
        for row in tables["cases"]:
            g = f["cases"][row["case"]]
            assert row["attention_s"] == pytest.approx(slowest_median(g["timings/attention"][()]))
            assert row["tflops"] == pytest.approx(g["metrics"].attrs["useful_tflops"])
            assert row["ranks"] == 1
    (ratio,) = tables["hilbert_vs_natural"]
    assert ratio["ordering"] == "hilbert" and ratio["ratio"] > 0
    assert "0001-g" in out and (tmp_path / "tiny.csv").exists()


def test_weak_series_split_by_tokens_per_rank(tmp_path):
    rng = np.random.default_rng(11)
    arrays = {(p, n): timings(rng, p, 0.1 * n / 4096 / p) for p, n in ((1, 4096), (2, 8192), (1, 8192), (2, 16384))}
    cases = [make_case(f"w{p}-{n}", a, scaling="weak", tokens=n, grid=[n]) for (p, n), a in arrays.items()]
    tables, _ = run_report([write_results(tmp_path / "w.h5", cases)])
    rows = tables["weak_scaling"]
    assert len(rows) == 4 and len({r["group"] for r in rows}) == 2
    for r in rows:
        density = r["tokens"] // r["ranks"]
        t0 = slowest_median(arrays[(1, density)])
        assert f"N/P={density}" in r["group"]
        assert r["efficiency"] == pytest.approx(t0 / slowest_median(arrays[(r["ranks"], r["tokens"])]))
