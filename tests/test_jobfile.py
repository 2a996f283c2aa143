"""Job files: expansion of sweeps and one clear message per problem."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hilbert_hpc.errors import JobFileError
from hilbert_hpc.jobfile import load_job

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


def job_text(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_sweeps_expand_to_the_cartesian_product(tmp_path):
    job = load_job(job_text(tmp_path, GOOD))
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
        from hilbert_hpc.maxlen import load_search

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
]


@pytest.mark.parametrize("text, param, words", BAD)
def test_bad_job_files_name_the_parameter(tmp_path, text, param, words):
    with pytest.raises(JobFileError) as info:
        load_job(job_text(tmp_path, text))
    assert info.value.param.endswith(param), str(info.value)
    assert words in info.value.message


def test_missing_file(tmp_path):
    with pytest.raises(JobFileError, match="cannot read job file"):
        load_job(tmp_path / "nope.toml")
