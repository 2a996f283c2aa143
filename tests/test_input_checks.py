"""Input checks that keep results from being lost or mixed: serializable grids, study names, plan sizes, the table."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hilbert_hpc.errors import ConfigError, JobFileError
from hilbert_hpc.study.jobfile import Case, load_job
from hilbert_hpc.core.patterns import Pattern, check_serializable, max_array_dims, parse_grid

from jobtext import job_text

ROOT = Path(__file__).resolve().parents[1]

#: a prime above 2**32: a hilbert-segment block of 2 * P tokens folds into a 2 x P tile
P = 4294967311


# --- grids the orderings can serialize --------------------------------------------------------------------------------

def test_natural_order_takes_any_number_of_axes():
    check_serializable((2,) * 100, "natural")
    check_serializable((2,) * 100, "hilbert-segment", segment=4)


def test_hilbert_refuses_more_key_bits_than_64():
    check_serializable((2,) * 63, "hilbert")                            # 63 axes x 1 bit
    check_serializable((1 << 16,) * 4, "hilbert")                       # 4 axes x 16 bits = 64
    with pytest.raises(ConfigError) as info:
        check_serializable((1 << 16, 1 << 16, 1 << 16, (1 << 16) + 1), "hilbert", param="cases[2].grid")
    assert info.value.param == "cases[2].grid"
    assert info.value.message == ("the hilbert ordering of 4 axes needs 4 x 17 bits (the longest axis, 65537, needs "
                                  "17) = 68 key bits, more than the 64-bit Hilbert key: use at most 3 axes of this "
                                  "length, shorter axes, or ordering = \"natural\"")


def test_hilbert_refuses_more_axes_than_numpy_arrays_hold():
    limit = max_array_dims() - 1                                        # the coordinates have axes + 1 dimensions
    check_serializable((2,) * limit, "hilbert")
    with pytest.raises(ConfigError) as info:
        check_serializable((2,) * (limit + 1), "hilbert")
    assert info.value.param == "grid"
    assert info.value.message == (f"the hilbert ordering takes at most {limit} axes here (NumPy arrays have at most "
                                  f"{max_array_dims()} dimensions), the grid has {limit + 1}: merge axes or use "
                                  f"ordering = \"natural\"")


def test_the_limit_is_the_real_one():
    """Right at the limit the hilbert order is computed; one axis more fails in the ordering code itself."""
    from hilbert_hpc.core.ordering import hilbert_curve_order

    limit = max_array_dims() - 1
    assert len(hilbert_curve_order((2, 2) + (1,) * (limit - 2))) == 4
    with pytest.raises(ValueError):
        hilbert_curve_order((2, 2) + (1,) * (limit - 1))
    with pytest.raises(ValueError, match="64-bit"):
        hilbert_curve_order((2, 2) + (1,) * 63)


def test_hilbert_segment_refuses_a_tile_side_beyond_32_bits(tmp_path):
    check_serializable((2 * P,), "hilbert-segment", segment=1 << 33)   # a 65536 x 131072 tile
    text = job_text(cases=[{"tokens": 2 * P, "patterns": [[2 * P, 1]], "ordering": "hilbert-segment"}])
    with pytest.raises(JobFileError) as info:
        load_job(tmp_path / "j.toml", text=text)
    assert info.value.param == "cases[0].segment"
    assert info.value.message == (f"the hilbert-segment tile of segment {2 * P} is (2, {P}); its longer side needs "
                                  f"33 bits, more than 32: choose a shorter segment")


def test_grid_entries_must_be_positive_integers():
    assert parse_grid([4, 4], 16) == (4, 4)
    for grid, entry in (([4, 0], "entry 1 is 0"), ([4, -1], "entry 1 is -1"), ([4.0, 4], "entry 0 is 4.0"),
                        ([4, "4"], "entry 1 is '4'"), ([False, 4], "entry 0 is False")):
        with pytest.raises(ConfigError) as info:
            parse_grid(grid, None, "cases[0].grid")
        assert info.value.param == "cases[0].grid"
        assert info.value.message == f"expected a non-empty list of positive integers, got {grid!r} ({entry})"
    with pytest.raises(ConfigError, match=r"expected a list of positive integers such as \[64, 64\], got '4x4'"):
        parse_grid("4x4", None)


# --- the max-length study's name --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, words", [("../../escaped", "contains '/'"), ("a..b", "contains '..'"),
                                         (".x", "starts with '.'"), ("", "the name is empty")])
def test_maxlen_search_name_is_an_identifier(tmp_path, name, words):
    from hilbert_hpc.study.maxlen import load_search

    text = (ROOT / "jobs" / "max_length.toml").read_text()
    path = tmp_path / "search.toml"
    path.write_text(text.replace('name = "max_length"', f'name = "{name}"'))
    with pytest.raises(JobFileError) as info:
        load_search(path)
    assert info.value.param == "search.name"
    assert words in info.value.message
    path.write_text(text.replace('name = "max_length"', 'name = "max_length.v2"'))
    assert load_search(path).name == "max_length.v2"


# --- plan: the size flags ---------------------------------------------------------------------------------------------

def test_parse_size_names_the_flag_it_parsed():
    from hilbert_hpc.study.plan import parse_size

    assert parse_size("80GiB") == 80 << 30 and parse_size("1.5kB", "--host-memory") == 1500
    for flag in ("--host-memory", "--device-memory"):
        with pytest.raises(ConfigError) as info:
            parse_size("lots", flag)
        assert info.value.param == flag
        assert info.value.message == "expected a size such as 80GiB or 512MB, got 'lots'"
    with pytest.raises(ConfigError) as info:
        parse_size("-3GB")
    assert info.value.param == "--device-memory"


def test_plan_command_names_host_memory(tmp_path, capsys):
    from hilbert_hpc.cli import main

    (tmp_path / "j.toml").write_text(job_text(cases=[{"tokens": 64, "patterns": [[64, 1]]}]))
    assert main(["plan", str(tmp_path / "j.toml"), "-n", "1", "--host-memory", "lots"]) == 2
    assert capsys.readouterr().err == ("hilbert-hpc: error: --host-memory: expected a size such as 80GiB or 512MB, "
                                       "got 'lots'\n")


# --- the run table ----------------------------------------------------------------------------------------------------

def _record() -> SimpleNamespace:
    """The parts of a case record (``study.record.CaseRecord``) the summary table prints."""
    return SimpleNamespace(metrics=SimpleNamespace(median_attention_s=0.012, median_total_s=0.013, tokens_per_s=2e5,
                                                   useful_tflops=0.05),
                           accuracy=SimpleNamespace(max_rel_err=1e-7, selected_pairs=96))


def test_table_rows_of_a_scaling_sweep_differ_in_ranks_and_causal():
    from hilbert_hpc.study.table import SummaryTable

    stream = io.StringIO()
    table = SummaryTable(stream)
    table.header()
    pats = (Pattern(64, 1),)
    for ranks, causal in ((1, False), (8, False), (8, True)):
        table.row(Case(case_id="0000-strong", name="strong", grid=(4096,), patterns=pats, ranks=ranks,
                       causal=causal), _record())
    head, rule, *rows = stream.getvalue().splitlines()
    assert head.split()[:6] == ["case", "ranks", "backend", "order", "causal", "dtype"]
    ranks_end = head.index("ranks") + len("ranks")
    causal_at = head.index("causal")
    assert [row[ranks_end - 5:ranks_end] for row in rows] == ["    1", "    8", "    8"]
    assert [row[causal_at:causal_at + 6] for row in rows] == ["no    ", "no    ", "yes   "]
    assert len(set(rows)) == 3
    assert all(len(row) <= len(rule) for row in rows)


@pytest.mark.parametrize("text, size", [("16G", 16 << 30), ("16g", 16 << 30), ("4MiB", 4 << 20), ("80GiB", 80 << 30),
                                        ("512MB", 512_000_000), ("80 GB", 80_000_000_000), ("2000000", 2_000_000),
                                        ("2Ki", 2048), ("1.5TB", 1_500_000_000_000), ("123B", 123),
                                        (" 8 gib ", 8 << 30)])
def test_parse_size_takes_the_spellings_people_type(text, size):
    from hilbert_hpc.study.plan import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("text, words", [("nanGiB", "expected a size"), ("infGiB", "expected a size"),
                                         ("1e400GiB", "not a size a machine has"), ("2e18GiB", "not a size"),
                                         ("0", "positive"), ("0.0GiB", "positive"), ("-3GB", "expected a size"),
                                         ("16 XB", "expected a size"), ("", "expected a size"),
                                         ("GiB", "expected a size")])
def test_parse_size_refuses_what_no_machine_has(text, words):
    from hilbert_hpc.study.plan import parse_size

    with pytest.raises(ConfigError, match=words) as info:
        parse_size(text)
    assert info.value.param == "--device-memory"


def plan_job(backend: str) -> str:
    """One 4096-token case on ``backend``, for ``plan``."""
    return job_text(defaults={"backend": backend, "heads": 4, "head_dim": 32},
                    cases=[{"tokens": 4096, "patterns": [[1024, 1]]}])


@pytest.mark.parametrize("ranks", ["0", "-4"])
def test_plan_refuses_a_rank_count_below_one(tmp_path, capsys, ranks):
    from hilbert_hpc.cli import main

    (tmp_path / "j.toml").write_text(plan_job("numpy"))
    assert main(["plan", str(tmp_path / "j.toml"), "-n", ranks]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"hilbert-hpc: error: -n/--ranks: expected a number of ranks >= 1, got {ranks}\n"


@pytest.mark.parametrize("backend", ["cuda", "cuda-fp32", "cupy"])
@pytest.mark.parametrize("flags, fits, code", [([], "?", 0), (["--device-memory", "80GiB"], "yes", 0),
                                               (["--gpu", "H100"], "yes", 0), (["--gpu", "a100-40gb"], "yes", 0),
                                               (["--device-memory", "64KiB"], "NO", 3)])
def test_plan_on_a_login_node_without_cupy_or_gpu(tmp_path, capsys, monkeypatch, backend, flags, fits, code):
    """GPU cases are planned without touching CUDA: no CuPy importable here at all."""
    from hilbert_hpc.cli import main

    monkeypatch.setitem(sys.modules, "cupy", None)          # import cupy -> ImportError
    (tmp_path / "j.toml").write_text(plan_job(backend))
    assert main(["plan", str(tmp_path / "j.toml"), "-n", "2", *flags]) == code
    captured = capsys.readouterr()
    row = [line for line in captured.out.splitlines() if line.startswith("0000-")]
    assert len(row) == 1 and row[0].split()[-1] == fits, captured.out
    assert f"backend {backend!r} needs an NVIDIA GPU; none is usable here" in captured.err
    assert "error" not in captured.err


def test_plan_for_a_named_gpu_states_its_memory(tmp_path, capsys, monkeypatch):
    from hilbert_hpc.cli import main
    from hilbert_hpc.study.plan import GPU_MODELS

    monkeypatch.setitem(sys.modules, "cupy", None)
    (tmp_path / "j.toml").write_text(plan_job("cuda"))
    assert main(["plan", str(tmp_path / "j.toml"), "-n", "1", "--gpu", "H200"]) == 0
    assert f"memory per rank: GPU {GPU_MODELS['H200'].memory / (1 << 30):.2f} GiB" in capsys.readouterr().out
    assert main(["plan", str(tmp_path / "j.toml"), "-n", "1", "--gpu", "B9000"]) == 2
    assert capsys.readouterr().err.startswith("hilbert-hpc: error: --gpu: unknown GPU model 'B9000'; known: H100")


def test_plan_still_refuses_a_gpu_case_that_cannot_be_distributed(tmp_path, capsys, monkeypatch):
    from hilbert_hpc.cli import main

    monkeypatch.setitem(sys.modules, "cupy", None)
    (tmp_path / "j.toml").write_text(plan_job("cuda"))
    assert main(["plan", str(tmp_path / "j.toml"), "-n", "3", "--gpu", "H100"]) == 2
    assert "do not divide the sequence length" in capsys.readouterr().err
