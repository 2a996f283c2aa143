"""Job files: expansion of sweeps and one clear message per problem."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hilbert_hpc.errors import JobFileError
from hilbert_hpc.study.jobfile import accuracy_rows_notes, check_name, load_job
from hilbert_hpc.core.patterns import max_array_dims

from jobtext import JobSpec, job_text

ROOT = Path(__file__).resolve().parents[1]

GOOD = """
[job]
name = "t"
repeats = 2
[defaults]
heads = 2
head_dim = 8
[[cases]]
name = "a"
grid = [16, 16]
patterns = [[64, 1], [256, 4]]
[cases.sweep]
ordering = ["natural", "hilbert"]
causal = [false, true]
[[cases]]
name = "b"
tokens = 512
patterns = [[512, 8]]
ordering = "hilbert-segment"
"""


def job_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_sweeps_expand_to_the_cartesian_product(tmp_path):
    job = load_job(job_file(tmp_path, GOOD))
    assert job.repeats == 2 and job.output == "results/t.h5"
    assert len(job.cases) == 5
    first = job.cases[0]
    assert (first.grid, first.heads, first.head_dim, first.tokens) == ((16, 16), 2, 8, 256)
    assert {(c.ordering, c.causal) for c in job.cases[:4]} == {
        ("natural", False), ("natural", True), ("hilbert", False), ("hilbert", True)}
    assert job.cases[4].segment == 512 and job.cases[4].grid == (512,)
    assert len({c.case_id for c in job.cases}) == 5


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "jobs").glob("*.toml")))
def test_shipped_job_files_are_valid(name):
    path = ROOT / "jobs" / name
    if "[search]" in path.read_text():          # a max-length study
        from hilbert_hpc.study.maxlen import load_search

        assert load_search(path).backends
        return
    job = load_job(path)
    assert job.cases


BAD = [
    (GOOD.replace("repeats = 2", "repeat = 3"), "job.repeat", "unknown key"),
    (GOOD.replace("repeats = 2", "repeats = \"two\""), "job.repeats", "expected an integer"),
    (GOOD.replace("repeats = 2", "repeats = 0"), "job.repeats", "at least 1"),
    (GOOD.replace("heads = 2", "heads = 2.5"), "defaults.heads", "expected an integer"),
    (GOOD.replace("[[64, 1], [256, 4]]", "[[64, 1], [100, 4]]"), "cases[0].patterns[1]", "does not divide"),
    (GOOD.replace("[[64, 1], [256, 4]]", "[[64, 3]]"), "cases[0].patterns[0]", "dilation 3 does not divide"),
    (GOOD.replace("[[64, 1], [256, 4]]", "[64, 1]"), "cases[0].patterns[0]", "pair"),
    (GOOD.replace("[\"natural\", \"hilbert\"]", "[\"natural\", \"zorder\"]"), "cases[0].sweep.ordering[1]",
     "expected one of"),
    (GOOD.replace("causal = [false, true]", "causal = []"), "cases[0].sweep.causal", "non-empty list"),
    (GOOD.replace("grid = [16, 16]", "grid = [16, 16]\ntokens = 300"), "cases[0].grid", "does not equal"),
    (GOOD.replace("grid = [16, 16]", "grid = [16, 0]"), "cases[0].grid", "positive integers"),
    (GOOD.replace("tokens = 512", "tokenz = 512"), "cases[1].tokenz", "unknown key"),
    (GOOD.replace("name = \"b\"\n", "name = \"b\"\nbackend = \"fortran\"\n"), "cases[1].backend", "expected one of"),
    (GOOD.replace("[[cases]]", "[[casez]]"), "casez", "unknown key"),
    ("[job]\nname = \"x\"\n", "cases", "at least one"),
    ("[job\nname=1", "job.toml", "not valid TOML"),
    # names become file and HDF5 group names: no path separators, no "..", nothing odd
    (GOOD.replace('name = "a"', 'name = "../../../../escaped"'), "cases[0].name", "contains '/'"),
    (GOOD.replace('name = "a"', 'name = "2d/32x32"'), "cases[0].name", "'2d/32x32' contains '/'"),
    (GOOD.replace('name = "b"', 'name = "a..b"'), "cases[1].name", "'a..b' contains '..'"),
    (GOOD.replace('name = "b"', 'name = ".hidden"'), "cases[1].name", "starts with '.'"),
    (GOOD.replace('name = "b"', 'name = "-x"'), "cases[1].name", "starts with '-'"),
    (GOOD.replace('name = "b"', 'name = "two words"'), "cases[1].name", "contains ' '"),
    (GOOD.replace('name = "b"', 'name = "tab\\there"'), "cases[1].name", "contains '\\t'"),
    (GOOD.replace('name = "b"', 'name = ""'), "cases[1].name", "the name is empty"),
    (GOOD.replace('name = "b"', f'name = "{"x" * 65}"'), "cases[1].name", "has 65 characters, at most 64"),
    (GOOD.replace('name = "b"', 'name = 3'), "cases[1].name", "expected a name (a string), got 3"),
    (GOOD.replace('name = "t"', 'name = "../t"'), "job.name", "'../t' contains '/'"),
    (GOOD.replace('name = "t"', 'name = "t\\u00e9"'), "job.name", "contains 'é'"),
    (GOOD.replace("heads = 2", "heads = 2\nname = \"d\""), "defaults.name", "unknown key"),
    # grid entries and the hilbert key limit (checked per ordering)
    (GOOD.replace("grid = [16, 16]", "grid = [16, -16]"), "cases[0].grid", "positive integers, got [16, -16] "
     "(entry 1 is -16)"),
    (GOOD.replace("grid = [16, 16]", "grid = [16, 16.0]"), "cases[0].grid", "(entry 1 is 16.0)"),
    (GOOD.replace("grid = [16, 16]", "grid = [16, true]"), "cases[0].grid", "(entry 1 is True)"),
    (GOOD.replace("grid = [16, 16]", "grid = \"16x16\""), "cases[0].grid", "got '16x16'"),
    (GOOD.replace("grid = [16, 16]", "grid = []"), "cases[0].grid", "non-empty list"),
    (GOOD.replace("grid = [16, 16]", f"grid = [16, 16{', 1' * 63}]"), "cases[0].grid",
     "the hilbert ordering of 65 axes needs 65 x 4 bits (the longest axis, 16, needs 4) = 260 key bits, more than "
     "the 64-bit Hilbert key: use at most 16 axes of this length"),
    (GOOD.replace("grid = [16, 16]", f"grid = [2, 2{', 2' * 6}{', 1' * 56}]"), "cases[0].grid",
     f"the hilbert ordering takes at most {max_array_dims() - 1} axes here (NumPy arrays have at most "
     f"{max_array_dims()} dimensions), the grid has 64"),
]


@pytest.mark.parametrize("text, param, words", BAD)
def test_bad_job_files_name_the_parameter(tmp_path, text, param, words):
    with pytest.raises(JobFileError) as info:
        load_job(job_file(tmp_path, text))
    assert info.value.param.endswith(param), str(info.value)
    assert words in info.value.message


def test_missing_file(tmp_path):
    with pytest.raises(JobFileError, match="cannot read job file"):
        load_job(tmp_path / "nope.toml")


def test_names_of_shipped_jobs_and_plain_identifiers_pass():
    for name in ("quickstart", "grid2d-128x128", "longnet-1m-per-gpu", "per-rank-64x128", "v1.2_final", "0003",
                 "_x", "x" * 64):
        assert check_name(name, "n") == name


def test_the_natural_ordering_takes_any_number_of_axes(tmp_path):
    text = GOOD.replace("grid = [16, 16]", f"grid = [16, 16{', 1' * 63}]").replace(
        '["natural", "hilbert"]', '["natural", "hilbert-segment"]')
    job = load_job(job_file(tmp_path, text))
    assert {len(c.grid) for c in job.cases[:4]} == {65}


def test_weak_scaling_checks_the_grid_of_every_rank_count(tmp_path):
    text = job_text(cases=[{"name": "w", "grid": [16] * 16, "patterns": [[16, 1]], "ordering": "hilbert",
                            "scaling": "weak", "ranks": "pow2"}])
    assert len(load_job(job_file(tmp_path, text), world_size=1).cases) == 1
    with pytest.raises(JobFileError) as info:
        load_job(job_file(tmp_path, text), world_size=2)      # 32 x 16 ...: 5 bits per axis, 80 key bits
    assert info.value.param == "cases[0].grid"
    assert "16 x 5 bits (the longest axis, 32, needs 5) = 80 key bits" in info.value.message


ROWS_JOB = JobSpec({"name": "rows", "accuracy_rows": 1000}, cases=[
    {"name": "tiny", "tokens": 256, "patterns": [[256, 1]]},
    {"name": "big", "tokens": 4096, "patterns": [[256, 1]]},
    {"name": "swept", "patterns": [[256, 1]],
     "sweep": {"tokens": [256, 512, 2048], "ordering": ["natural", "hilbert"]}},
])


def test_accuracy_rows_notes_state_the_clamping(tmp_path):
    job = load_job(job_file(tmp_path, ROWS_JOB.text()))
    assert accuracy_rows_notes(job) == [
        "case 0000-tiny has 256 tokens, fewer than accuracy_rows = 1000: all 256 rows are checked",
        "cases 0002-swept ... 0005-swept (4 cases named swept) have 256 to 512 tokens, fewer than "
        "accuracy_rows = 1000: all of their rows are checked",
    ]
    assert accuracy_rows_notes(load_job(job_file(tmp_path, ROWS_JOB.but(accuracy_rows=256).text()))) == []
    assert accuracy_rows_notes(load_job(job_file(tmp_path, ROWS_JOB.but(accuracy_rows=0).text()))) == []


def test_accuracy_rows_notes_count_the_rows_the_patterns_select(tmp_path):
    """Sparse patterns select fewer rows than there are tokens; the note says how many are checked."""
    text = ROWS_JOB.but(accuracy_rows=40, defaults={"heads": 2}, case={"patterns": [[256, 64]]}).text()
    job = load_job(job_file(tmp_path, text))
    # 2 heads, dilation 64: rows s with s % 64 in {0, 1}, 2 per 64 tokens (2048 tokens: 64 rows, enough)
    assert accuracy_rows_notes(job) == [
        "case 0000-tiny has 8 rows selected by the patterns, fewer than accuracy_rows = 40: "
        "all 8 selected rows are checked",
        "cases 0002-swept ... 0005-swept (4 cases named swept) have 8 to 16 rows selected by the patterns, "
        "fewer than accuracy_rows = 40: all of their selected rows are checked",
    ]


def test_interleave_is_a_job_setting_recorded_with_the_others(tmp_path):
    text = ROWS_JOB.but(interleave=True).text()
    job = load_job(job_file(tmp_path, text))
    assert job.interleave and job.settings["interleave"] is True
    default = load_job(job_file(tmp_path, ROWS_JOB.text()))
    assert not default.interleave and default.settings["interleave"] is False
    with pytest.raises(JobFileError) as info:
        load_job(job_file(tmp_path, ROWS_JOB.but(interleave="yes").text()))
    assert info.value.param == "job.interleave" and "expected true or false" in info.value.message
