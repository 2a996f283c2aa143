"""Seeds never alias: every accepted seed gives its own inputs, the rest are refused; old seeds keep their values."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from hilbert_hpc.errors import JobFileError
from hilbert_hpc.core.inputs import MAX_SEED, random_rows
from hilbert_hpc.study.jobfile import load_job

from clirun import run_in_process
from jobtext import job_text


def seed_job(seed: int) -> str:
    """A one-case job with ``seed``."""
    return job_text(name="seeds", seed=seed, cases=[{"grid": [16], "patterns": [[16, 1]], "heads": 1, "head_dim": 8}])


def _digest(seed: int) -> str:
    return hashlib.sha256(random_rows(seed, "v", np.arange(100, 164), 3, 8).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("seed,expected", [(0, "5aa066501cd020d8"), (1, "23226785bebd1ecf"),
                                           (2026, "4c97c81726c0f303"), (MAX_SEED, "898b394f136c9850")])
def test_seeds_that_were_valid_keep_their_values(seed, expected):
    """Values computed by the previous version (whose key wrapped only for seeds >= 2**62)."""
    assert _digest(seed) == expected


def test_distinct_accepted_seeds_give_distinct_inputs():
    seeds = [0, 1, 2, 3, 4, 2**32, 2**61, MAX_SEED - 1, MAX_SEED]
    rows = {s: random_rows(s, "q", np.arange(8), 2, 4).tobytes() for s in seeds}
    assert len(set(rows.values())) == len(seeds)
    q, k = random_rows(5, "q", np.arange(8), 2, 4), random_rows(5, "k", np.arange(8), 2, 4)
    assert not np.array_equal(q, k)


@pytest.mark.parametrize("seed", [2**62, 2**64, 2**64 + 1, -1, -(2**62)])
def test_seeds_that_would_alias_are_refused_by_the_api(seed):
    with pytest.raises(ValueError, match=r"seed must be from 0 to 2\*\*62 - 1"):
        random_rows(seed, "q", np.arange(4), 2, 4)


@pytest.mark.parametrize("seed", [1.5, True, "3", None])
def test_seeds_that_are_not_integers_are_refused_by_the_api(seed):
    with pytest.raises(ValueError, match="seed must be an integer"):
        random_rows(seed, "q", np.arange(4), 2, 4)


def test_unknown_tensor_is_refused_by_the_api():
    with pytest.raises(ValueError, match="tensor must be one of"):
        random_rows(0, "x", np.arange(4), 2, 4)


@pytest.mark.parametrize("seed", [2**62, 2**63 - 1, -1])
def test_job_file_seed_out_of_range_names_job_seed(tmp_path, seed):
    (tmp_path / "job.toml").write_text(seed_job(seed))
    with pytest.raises(JobFileError) as info:
        load_job(tmp_path / "job.toml")
    assert info.value.param == "job.seed"
    assert load_job_ok(tmp_path, MAX_SEED).seed == MAX_SEED


def load_job_ok(tmp_path: Path, seed: int):
    (tmp_path / "ok.toml").write_text(seed_job(seed))
    return load_job(tmp_path / "ok.toml")


def test_job_file_seed_out_of_range_is_one_line(tmp_path):
    (tmp_path / "job.toml").write_text(seed_job(2**62))
    res = run_in_process(["run", "job.toml", "-o", "r.h5"], tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "job.seed" in lines[0] and "2**62" in lines[0], res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]
