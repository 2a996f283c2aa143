"""Nonsense on the command line and in files: one line naming the problem, a non-zero exit, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hilbert_hpc.errors import JobFileError

from clirun import run_in_process
from jobtext import QUICK, job_text

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``hilbert-hpc ARGS`` in ``cwd``: in this process, or in a process of its own started with ``env``."""
    if env is None:
        return run_in_process(args, cwd)
    return subprocess.run([sys.executable, "-m", "hilbert_hpc", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


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


# --- job files: what is read is capped --------------------------------------------------------------------------------

def test_a_job_file_larger_than_the_cap_is_refused_before_parsing(tmp_path):
    from hilbert_hpc.study.jobfile import MAX_JOB_BYTES, read_toml

    big = tmp_path / "big.toml"
    line = b"# a comment line of a very long TOML file\n"
    big.write_bytes(line * (MAX_JOB_BYTES // len(line) + 1))
    with pytest.raises(JobFileError, match="larger than 16 MiB"):
        read_toml(big)


@pytest.mark.parametrize("command", [["run"], ["plan", "-n", "1"], ["maxlen"]])
def test_dev_zero_as_a_job_file_is_one_line(tmp_path, command):
    res = cli(command[0], "/dev/zero", *command[1:], cwd=tmp_path)
    assert res.returncode == 2
    one_error_line(res, "/dev/zero", "larger than 16 MiB")


# --- bandwidth: arguments checked before the sweep ------------------------------------------------------------------

@pytest.mark.parametrize("flags, words", [(["--iterations", "0"], "--iterations: expected an integer >= 1, got 0"),
                                          (["--iterations", "-3"], "--iterations: expected an integer >= 1, got -3"),
                                          (["--max-bytes", "0"], "--max-bytes: expected a positive size"),
                                          (["--max-bytes", "-1"], "--max-bytes: expected a size"),
                                          (["--max-bytes", "512"], "--max-bytes: expected a message size in bytes"),
                                          (["--device", "gpu"], "--device: GPU buffers need CuPy and an NVIDIA GPU")])
def test_bandwidth_refuses_arguments_that_measure_nothing(tmp_path, flags, words):
    # the GPU is looked at in a process started without one; the other arguments are refused before that
    no_gpu = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    res = cli("bandwidth", *flags, "-o", "bw.h5", cwd=tmp_path, env=no_gpu if "--device" in flags else None)
    assert res.returncode == 2
    assert res.stdout == ""
    one_error_line(res, words)
    assert not (tmp_path / "bw.h5").exists()


def test_bandwidth_takes_a_size_with_a_unit(tmp_path):
    res = cli("bandwidth", "--max-bytes", "4KiB", "--iterations", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    sizes = [line.split()[0] for line in res.stdout.splitlines() if not line.startswith("#")]
    assert sizes == ["1024", "2048", "4096"]


# --- standard output: a reader that leaves, a full device ------------------------------------------------------------

TINY_JOB = job_text(name="tiny", **QUICK, defaults={"heads": 2, "head_dim": 8},
                    cases=[{"name": "t", "tokens": 256, "patterns": [[64, 1]],
                            "sweep": {"ordering": ["natural", "hilbert"]}}])


def _closed_pipe(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run the command with its standard output a pipe whose reader has already gone (``| head -0``)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "hilbert_hpc", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.fixture
def results_file(tmp_path) -> Path:
    (tmp_path / "job.toml").write_text(TINY_JOB)
    res = cli("run", "job.toml", "-o", "r.h5", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return tmp_path / "r.h5"


@pytest.mark.parametrize("command", [["report", "r.h5"], ["plan", "job.toml", "-n", "2"], ["info"]])
def test_a_closed_pipe_ends_quietly_with_141(results_file, command):
    res = _closed_pipe(command, results_file.parent)
    assert (res.returncode, res.stderr) == (141, "")


def test_a_closed_pipe_stops_a_run_with_one_note_and_keeps_the_file_sound(tmp_path):
    (tmp_path / "job.toml").write_text(TINY_JOB)
    res = _closed_pipe(["run", "job.toml", "-o", "r.h5"], tmp_path)
    assert res.returncode == 141
    assert res.stderr.splitlines() == ["hilbert-hpc: standard output was closed: the run stopped; its complete "
                                       "cases are kept (continue with run --resume)"]
    again = cli("run", "job.toml", "-o", "r.h5", "--resume", cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def test_report_into_head_leaves_no_traceback(results_file):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    res = subprocess.run(["bash", "-c", f"{sys.executable} -m hilbert_hpc report r.h5 | head -1; "
                                        "exit ${PIPESTATUS[0]}"], cwd=results_file.parent, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 141) and res.stderr == ""
    assert len(res.stdout.splitlines()) == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("command", [["--version"], ["report", "r.h5"], ["plan", "job.toml", "-n", "2"], ["info"],
                                     ["run", "job.toml", "-o", "r2.h5"]])
def test_stdout_on_a_full_device_is_one_line(results_file, command):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-m", "hilbert_hpc", *command], cwd=results_file.parent, env=env,
                             stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.splitlines()[-1:] == ["hilbert-hpc: error: cannot write to standard output: "
                                            "No space left on device"]
    one_error_line(subprocess.CompletedProcess(res.args, res.returncode, "", res.stderr.splitlines()[-1] + "\n"))
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr
