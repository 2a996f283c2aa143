"""Nonsense on the command line and in files: one line naming the problem, a non-zero exit, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hilbert_hpc.errors import JobFileError

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "hilbert_hpc", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def one_error_line(res: subprocess.CompletedProcess, *words: str) -> str:
    """The single stderr line of a refused command (checked: non-zero exit, no traceback, the words in it)."""
    assert res.returncode != 0, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("hilbert-hpc: error: "), lines
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# --- job files: what is read is capped ---------------------------------------------------------------------------------

def test_a_job_file_larger_than_the_cap_is_refused_before_parsing(tmp_path):
    from hilbert_hpc.jobfile import MAX_JOB_BYTES, read_toml

    big = tmp_path / "big.toml"
    line = b"# a comment line of a very long TOML file\n"
    big.write_bytes(line * (MAX_JOB_BYTES // len(line) + 1))
    with pytest.raises(JobFileError, match="larger than 16 MiB"):
        read_toml(big)


@pytest.mark.parametrize("command", [["run"], ["plan", "-n", "1"], ["maxlen"]])
def test_dev_zero_as_a_job_file_is_one_line(tmp_path, command):
    res = cli(command[0], "/dev/zero", *command[1:], cwd=tmp_path, timeout=60)
    assert res.returncode == 2
    one_error_line(res, "/dev/zero", "larger than 16 MiB")
