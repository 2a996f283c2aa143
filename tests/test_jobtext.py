"""The tests' job text writer: what tomllib reads back is exactly the keys given, in their order."""

from __future__ import annotations

import tomllib

import pytest

from jobtext import DROP, QUICK, JobSpec, job_text, toml_text

SPEC = JobSpec({"name": "t", **QUICK, "save_output": True}, defaults={"heads": 2, "dtype": "float64"},
               cases=[{"name": "a", "grid": [16, 16], "patterns": [[64, 1], ["N", "N/4"]],
                       "sweep": {"ordering": ["natural", "hilbert"], "causal": [False, True]}},
                      {"name": "b", "tokens": 512, "patterns": [[512, 8]]}])


def test_the_text_reads_back_as_the_document_in_the_same_order():
    doc = tomllib.loads(SPEC.text())
    assert doc == SPEC.document()
    assert list(doc) == ["job", "defaults", "cases"] and list(doc["cases"][0]) == ["name", "grid", "patterns", "sweep"]
    assert list(doc["cases"][0]["sweep"]) == ["ordering", "causal"]


@pytest.mark.parametrize("value", ["tab\there", 'quote " and \\ backslash', "line\nbreak", "caf\u00e9", "\x00\x1f\x7f",
                                   "../../x", "", 0.1, 0.30000000000000004, 1e-300, 1e22, -0.0, 2**63 - 1, -1,
                                   True, [1, [2.5, "x"], []]])
def test_values_survive_the_round_trip(value):
    assert tomllib.loads(toml_text({"t": {"v": value, "odd key": 1}})) == {"t": {"v": value, "odd key": 1}}


def test_special_floats_are_spelled_in_toml():
    doc = tomllib.loads(toml_text({"v": [float("inf"), float("-inf")]}))
    assert doc == {"v": [float("inf"), float("-inf")]}


def test_but_changes_drops_and_adds_keys_without_touching_the_original():
    before = SPEC.text()
    spec = SPEC.but(repeats=3, seed=DROP, defaults={"heads": DROP, "head_dim": 4}, case={"grid": DROP, "tokens": 256})
    doc = spec.document()
    assert doc["job"] == {"name": "t", "repeats": 3, "warmup": 0, "accuracy_rows": 4, "save_output": True}
    assert doc["defaults"] == {"dtype": "float64", "head_dim": 4}
    assert [c.get("grid") for c in doc["cases"]] == [None, None] and [c["tokens"] for c in doc["cases"]] == [256, 256]
    assert SPEC.text() == before
    one = SPEC.but_case(1, {"name": "c"}).document()["cases"]
    assert [c["name"] for c in one] == ["a", "c"]


def test_empty_sections_are_left_out():
    assert tomllib.loads(job_text(cases=[{"tokens": 64, "patterns": [[64, 1]]}])) == {
        "cases": [{"tokens": 64, "patterns": [[64, 1]]}]}


def test_a_value_without_a_toml_spelling_is_refused():
    with pytest.raises(TypeError, match="no TOML spelling for NoneType"):
        job_text(name=None, cases=[])
