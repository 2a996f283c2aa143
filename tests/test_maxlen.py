"""The max-length search on the CPU: doubling, bisection, the longest fit checked, clear errors."""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest

from hilbert_hpc.core import inputs
from hilbert_hpc.study import maxlen
from hilbert_hpc.cli import main
from hilbert_hpc.errors import JobFileError

STUDY = """
[search]
name = "tiny"
backends = ["numpy"]
heads = 2
head_dim = 16
local_patterns = [[64, 1], [256, 4]]
global_rows = 64
start = 256
limit = 2048
accuracy_rows = 3
"""


def test_search_bisects_to_the_largest_length_that_fits(tmp_path, monkeypatch):
    study = tmp_path / "s.toml"
    study.write_text(STUDY)
    real = maxlen.trial

    def limited(search, backend, tokens, check_rows=0):
        if tokens > 1280:                              # pretend the device holds at most 1280 tokens
            return {**real(search, backend, 256), "tokens": tokens, "fits": False}
        return real(search, backend, tokens, check_rows)

    monkeypatch.setattr(maxlen, "trial", limited)
    out = maxlen.run_search(study, tmp_path / "m.h5")
    with h5py.File(out) as f:
        tokens, fits, longest = (f["trials"][k][()] for k in ("tokens", "fits", "longest"))
        err = f["trials"]["max_rel_err"][()]
    assert list(tokens[:4]) == [256, 512, 1024, 2048] and not fits[3]
    assert tokens[longest][0] == 1280 and all(t % 256 == 0 for t in tokens)
    assert err[longest][0] < 1e-5                      # the longest run is checked against float64


def test_limit_is_reported_when_everything_fits(tmp_path, capsys):
    study = tmp_path / "s.toml"
    study.write_text(STUDY.replace("limit = 2048", "limit = 512"))
    maxlen.run_search(study, tmp_path / "m.h5")
    assert "longest (the study's limit)" in capsys.readouterr().out


@pytest.mark.parametrize("edit, where", [
    (("start = 256", "start = 100"), "search.start"),
    (("heads = 2", "heads = 0"), "search.heads"),
    (('backends = ["numpy"]', 'backends = ["nope"]'), "search.backends"),
    (("limit = 2048", "limit = 128"), "search.limit"),
    (("heads = 2", "colour = 2"), "search.colour"),
    (("accuracy_rows = 3", 'accuracy_rows = 3\npass = "backward"'), "search.pass"),
])
def test_bad_study_files_name_the_problem(tmp_path, edit, where):
    study = tmp_path / "s.toml"
    study.write_text(STUDY.replace(*edit))
    with pytest.raises(JobFileError) as info:
        maxlen.load_search(study)
    assert where in str(info.value)


def test_cli_refuses_a_job_file_with_exit_code_2(capsys):
    assert main(["maxlen", "jobs/quickstart.toml"]) == 2
    assert "[search]" in capsys.readouterr().err


def test_random_rows_in_chunks_equal_one_block(monkeypatch):
    whole = inputs.random_rows(5, "k", np.arange(3000), 3, 32)
    monkeypatch.setattr(inputs, "CHUNK_ELEMENTS", 1000)
    assert np.array_equal(inputs.random_rows(5, "k", np.arange(3000), 3, 32), whole)


@pytest.mark.parametrize("value", ["5", "true", "[\"a.h5\"]", "\"\"", "\"  \""])
def test_an_output_that_is_not_a_file_name_is_refused(tmp_path, monkeypatch, capsys, value):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(STUDY + f"output = {value}\n")
    assert main(["maxlen", "s.toml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hilbert-hpc: error: search.output: expected a file name") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]      # no file named 5 (or True)


def test_forward_backward_trials_time_the_backward_and_count_its_memory(tmp_path, capsys):
    """pass = "forward+backward": each trial runs the backward too; the floor counts Q, K, V, O, dO, dQ, dK, dV
    and planned_bytes is plan's estimate of the case (its backward included)."""
    from hilbert_hpc.study.jobfile import Case
    from hilbert_hpc.study.plan import estimate

    study = tmp_path / "s.toml"
    study.write_text(STUDY.replace("limit = 2048", "limit = 512") + 'pass = "forward+backward"\n')
    maxlen.run_search(study, tmp_path / "m.h5")
    assert "+ backward" in capsys.readouterr().out
    search = maxlen.load_search(study)
    with h5py.File(tmp_path / "m.h5") as f:
        t = {k: f["trials"][k][()] for k in ("tokens", "backward_s", "floor_bytes", "planned_bytes", "max_rel_err")}
        assert f.attrs["pass"] == "forward+backward"
    assert (t["backward_s"] > 0).all() and np.nanmax(t["max_rel_err"]) < 1e-5
    for n, floor, planned in zip(t["tokens"], t["floor_bytes"], t["planned_bytes"]):
        assert floor == 8 * n * 2 * 16 * 4
        case = Case(case_id="c", name="tiny", grid=(int(n),), patterns=search.patterns(int(n)), heads=2,
                    head_dim=16, backend="numpy", pass_="forward+backward")
        assert planned == estimate(case, accuracy_rows=0).memory_bytes > \
            estimate(dataclasses.replace(case, pass_="forward")).memory_bytes


def test_a_backend_without_the_backward_is_refused_for_forward_backward(tmp_path):
    study = tmp_path / "s.toml"
    study.write_text(STUDY.replace('["numpy"]', '["cupy"]') + 'pass = "forward+backward"\n')
    with pytest.raises(JobFileError) as err:
        maxlen.load_search(study)
    assert err.value.param == "search.pass" and "numpy" in str(err.value)
