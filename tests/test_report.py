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
from hilbert_hpc.study.report import report

from jobtext import job_text

BASE = {"name": "g", "tokens": 4096, "grid": [64, 64], "patterns": [[256, 1], [4096, 16]], "batch": 1, "heads": 4,
        "head_dim": 32, "causal": False, "ordering": "natural", "segment": 0, "dtype": "float32",
        "backend": "numpy", "scale": 0.17677669529663687, "transport": "auto", "input": ""}


def make_case(cid: str, attention: np.ndarray, *, complete: bool = True, json_ranks: bool = True,
              total: np.ndarray | None = None, flops: float = 2e9, counters: dict | None = None,
              attrs: dict | None = None, accuracy: dict | None = None, **params) -> dict:
    """A case description for write_results: parameters, raw (ranks, repeats) timings and flags; ``attrs``
    are case attributes the run records over the parameters' (e.g. the transport used), ``accuracy`` the
    accuracy record's (default max_rel_err 1e-6, rel_l2_err 1e-7)."""
    attention = np.asarray(attention, dtype=np.float64)
    p = dict(BASE, ranks=attention.shape[0], scaling="strong")
    p.update(params)
    return {"id": cid, "params": p, "attention": attention, "complete": complete, "json_ranks": json_ranks,
            "total": attention * 1.5 if total is None else np.asarray(total, dtype=np.float64), "flops": flops,
            "counters": counters or {}, "attrs": attrs or {},
            "accuracy": {"max_rel_err": 1e-6, "rel_l2_err": 1e-7, **(accuracy or {})}}


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
            g.attrs.update(c.get("attrs", {}))
            t = g.create_group("timings")
            t["attention"] = c["attention"]
            t["total"] = c["total"]
            t["serialize"] = c["attention"] * 0.1
            for name, values in c["counters"].items():
                t[name] = np.asarray(values, dtype=np.float64)
            g.create_group("metrics").attrs["useful_flops"] = c["flops"]
            g["metrics"].attrs["useful_tflops"] = 123.0  # deliberately wrong: the report recomputes
            g.create_group("accuracy").attrs.update(c["accuracy"])
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
    assert "peers: torch, flash" in text


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
    assert any("keeping the one of the file given later" in n and "p2b.h5" in n for n in tables["notes"])
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
                                                                                 "weak_scaling.png",
                                                                                 "accuracy_ranks.png"))
    for path in tables["plots"]:
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # only the tables with rows get a plot
    tables, _ = run_report([write_results(tmp_path / "t.h5", strong)], plot_dir=tmp_path / "only")
    assert [p.rsplit("/", 1)[-1] for p in tables["plots"]] == ["strong_scaling.png", "accuracy_ranks.png"]
    unchecked = [make_case(f"u{p}", timings(rng, p, 1.0 / p), accuracy={"max_rel_err": math.nan}) for p in (1, 2)]
    tables, _ = run_report([write_results(tmp_path / "u.h5", unchecked)], plot_dir=tmp_path / "unchecked")
    assert [p.rsplit("/", 1)[-1] for p in tables["plots"]] == ["strong_scaling.png"]


def test_accuracy_against_ranks_and_its_growth(tmp_path):
    """One row per case of a series that differs only in ranks and was checked against float64: the output's
    error and, for forward+backward series, each gradient's, with their growth against the fewest ranks; a
    series with one rank count, and cases without a check, are left out."""
    rng = np.random.default_rng(12)
    grads = {1: (2e-7, 3e-7, 1e-7), 2: (2e-7, 6e-7, 1e-7), 4: (4e-7, 3e-7, 1e-7)}
    fb = [make_case(f"f{p}", timings(rng, p, 1.0 / p), counters={"backward": timings(rng, p, 2.0 / p)},
                    accuracy={"max_rel_err": 1e-6 * p, "grad_q_max_rel_err": grads[p][0],
                              "grad_k_max_rel_err": grads[p][1], "grad_v_max_rel_err": grads[p][2]},
                    **{"pass": "forward+backward"})
          for p in (1, 2, 4)]
    fwd = [make_case(f"o{p}", timings(rng, p, 1.0 / p), name="fwd", accuracy={"max_rel_err": 3e-6}) for p in (2, 8)]
    lone = [make_case("l1", timings(rng, 1, 1.0), name="lone")]
    unchecked = [make_case(f"n{p}", timings(rng, p, 1.0), name="nan", accuracy={"max_rel_err": math.nan})
                 for p in (1, 2)]
    tables, text = run_report([write_results(tmp_path / "a.h5", fb + fwd + lone + unchecked)])
    rows = tables["accuracy_ranks"]
    assert [r["case"] for r in rows] == ["f1", "f2", "f4", "o2", "o8"]
    by = {r["case"]: r for r in rows}
    assert [by[c]["max_rel_err"] for c in ("f1", "f2", "f4")] == pytest.approx([1e-6, 2e-6, 4e-6])
    assert [by[c]["growth"] for c in ("f1", "f2", "f4")] == pytest.approx([1.0, 2.0, 4.0])
    assert [by[c]["grad_max_rel_err"] for c in ("f1", "f2", "f4")] == pytest.approx([3e-7, 6e-7, 4e-7])
    assert [by[c]["grad_growth"] for c in ("f1", "f2", "f4")] == pytest.approx([1.0, 2.0, 4 / 3])
    assert by["f2"]["grad_k_max_rel_err"] == pytest.approx(6e-7)
    assert [by[c]["growth"] for c in ("o2", "o8")] == [1.0, 1.0] and "grad_growth" not in by["o8"]
    assert "accuracy against ranks" in text and "dK err" in text


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
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.distributed.mpi import SingleProcessComm
    from hilbert_hpc.study.runner import run_job

    text = job_text(name="tiny", repeats=2, warmup=0, accuracy_rows=4,
                    defaults={"heads": 2, "head_dim": 8, "dtype": "float64"},
                    cases=[{"name": "g", "grid": [16, 16], "patterns": [[64, 1], [256, 4]],
                            "sweep": {"ordering": ["natural", "hilbert"]}}])
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


# ----------------------------------------------------------------------------------------------------------------
# compact tables, warnings, transports, noise


def _researcher_cases(rng: np.random.Generator) -> list[dict]:
    """A study as a researcher writes one: long names, two orderings, a peer, 1-8 ranks, staged transport."""
    long = dict(name="hilbert_vs_natural_bf16_long_patterns", dtype="bfloat16", backend="cuda-fp32",
                tokens=262144, grid=[512, 512], patterns=[[4096, 64], [16384, 64], [262144, 1024]],
                attrs={"transport": "staged"})
    cases = [make_case(f"{i:04d}-hilbert_vs_natural_bf16_long_patterns", timings(rng, p, 0.01 / p), ordering=o,
                       **long) for i, (p, o) in enumerate((p, o) for p in (1, 2, 4, 8) for o in ("natural", "hilbert"))]
    cases.append(make_case("0099-peer", timings(rng, 1, 0.05), **dict(long, backend="torch")))
    return cases


def test_compact_tables_fit_and_wide_shows_every_column(tmp_path):
    rng = np.random.default_rng(20)
    a = write_results(tmp_path / "a_rather_long_results_file_name_for_the_h200_ordering_study.h5",
                      _researcher_cases(rng))
    b = write_results(tmp_path / "b.h5", [make_case("0000-g", timings(rng, 2, 0.1))])
    tables, text = run_report([a, b])
    table_lines = [line for line in text.splitlines() if not line.startswith(("note:", "  file "))]
    assert max(len(line) for line in table_lines) <= 120, "\n".join(table_lines)
    assert f"  file 1: {a}" in text and f"  file 2: {b}" in text
    legend = [line for line in text.splitlines() if line.startswith("  g1 = ")]
    assert legend and "hilbert_vs_natural_bf16_long_patterns" in legend[0]
    _, wide = run_report([a, b], wide=True)
    for title in ("total ms", "attn/total", "tokens/s", "peer case", "ratio range", "speedup range", a):
        assert title in wide, title
    assert max(len(line) for line in wide.splitlines()) > 120
    assert tables["cases"][0]["file"] == a          # rows (and the CSV) keep every field


def test_a_wide_spread_and_a_superlinear_efficiency_get_notes(tmp_path):
    steady = np.full((1, 5), 1.0)
    noisy = np.array([[0.04, 0.05, 0.06, 0.5, 1.0]])          # 25x between the fastest and the slowest repeat
    cases = [make_case("base", steady), make_case("fast8", np.full((8, 5), 1.0 / 8 / 6.85)),
             make_case("noisy", noisy, name="other")]
    tables, text = run_report([write_results(tmp_path / "w.h5", cases)])
    spread = {r["case"]: r["spread"] for r in tables["cases"]}
    assert spread["noisy"] == pytest.approx(25.0) and spread["base"] == pytest.approx(1.0)
    (eff,) = [r for r in tables["strong_scaling"] if r["ranks"] == 8]
    assert eff["efficiency"] == pytest.approx(6.85)
    notes = [n for n in tables["notes"]]
    assert any("case noisy" in n and "25x" in n for n in notes), notes
    assert any("efficiency 6.85" in n and "P=8" in n and "superlinear" in n for n in notes), notes
    assert not any("case base" in n or "case fast8" in n for n in notes)
    assert "25!" in text and "6.85!" in text
    assert f"note: {[n for n in notes if 'noisy' in n][0]}" in text


def test_labels_and_plot_legend_name_the_transport_used(tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(21)
    cases = [make_case(f"s{p}", timings(rng, p, 1.0 / p), attrs={"transport": "none" if p == 1 else "staged"})
             for p in (1, 2, 4)]
    cases += [make_case(f"w{p}", timings(rng, p, 0.1), scaling="weak", tokens=4096 * p, grid=[64, 64 * p],
                        attrs={"transport": "none" if p == 1 else "cuda-aware"}) for p in (1, 2)]
    tables, text = run_report([write_results(tmp_path / "t.h5", cases)])
    (strong,) = {r["group"] for r in tables["strong_scaling"]}
    (weak,) = {r["group"] for r in tables["weak_scaling"]}
    assert " staged " in f" {strong} " and "auto" not in strong
    assert " cuda-aware " in f" {weak} " and "auto" not in weak
    assert [r["transport"] for r in tables["cases"]] == ["none", "staged", "staged", "none", "cuda-aware"]
    from hilbert_hpc.study.report_files import scaling_figure

    fig = scaling_figure(tables["strong_scaling"], "strong", "efficiency", True)
    legend = [t.get_text() for box in fig.legends for t in box.get_texts()]
    assert legend and all("staged" in t and "auto" not in t for t in legend), legend


def _pair(tmp_path, natural: list[float], hilbert: list[float]) -> dict:
    cases = [make_case("n", np.array([natural])), make_case("h", np.array([hilbert]), ordering="hilbert")]
    tables, _ = run_report([write_results(tmp_path / f"p{len(list(tmp_path.iterdir()))}.h5", cases)])
    return tables


def test_ratios_within_the_repeats_spread_are_marked(tmp_path):
    # the example: 1.88 vs 1.89 ms medians in a 1.60-2.27 ms spread are one measurement
    tables = _pair(tmp_path, [1.60e-3, 1.88e-3, 2.27e-3], [1.62e-3, 1.89e-3, 2.20e-3])
    (row,) = tables["hilbert_vs_natural"]
    assert row["noise"] == "within noise"
    assert row["ratio_min"] == pytest.approx(1.60 / 2.20) and row["ratio_max"] == pytest.approx(2.27 / 1.62)
    assert any("hilbert vs natural: 1 of 1 ratio(s) within noise (h)" in n for n in tables["notes"])
    # a 1.73x median ratio is resolved only when the two ranges do not overlap
    tables = _pair(tmp_path, [3.2e-3, 3.3e-3, 3.4e-3], [1.8e-3, 1.9e-3, 2.0e-3])
    (row,) = tables["hilbert_vs_natural"]
    assert row["noise"] == "resolved" and row["ratio"] == pytest.approx(3.3 / 1.9)
    assert not any("within noise" in n for n in tables["notes"])
    tables = _pair(tmp_path, [3.3e-3], [1.9e-3])
    assert tables["hilbert_vs_natural"][0]["noise"] == "too few repeats"


def test_scaling_and_peer_ratios_say_when_they_are_noise(tmp_path):
    one = np.array([[1.0, 1.5, 2.0]])
    cases = [make_case("p1", one), make_case("p2", np.array([[0.9, 1.0, 1.1], [0.95, 1.0, 1.05]])),
             make_case("p4", np.full((4, 3), 0.3)),
             make_case("peer", np.array([[1.2, 1.3, 1.4]]), backend="torch"),
             make_case("w1", one, scaling="weak", name="w"), make_case("w2", np.full((2, 3), 1.2), scaling="weak",
                                                                     name="w", tokens=8192, grid=[64, 128])]
    tables, text = run_report([write_results(tmp_path / "n.h5", cases)])
    strong = {r["case"]: r["noise"] for r in tables["strong_scaling"]}
    assert strong == {"p1": "", "p2": "within noise", "p4": "resolved"}
    weak = {r["case"]: r["noise"] for r in tables["weak_scaling"]}
    assert weak == {"w1": "", "w2": "within noise"}
    peer = {r["case"]: r["noise"] for r in tables["peer_ratio"]}
    assert peer == {"p1": "within noise", "p2": "resolved", "p4": "resolved"}
    for title in ("strong scaling", "weak scaling", "peers"):
        assert any(n.startswith(f"{title}: 1 of") and "within noise" in n for n in tables["notes"]), title
    assert "within noise" in text
