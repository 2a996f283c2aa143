"""Ctrl-C of ``mpiexec``: the launcher ends the ranks within a second, and the user still learns what was kept."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from hilbert_hpc.study import signals

from jobtext import job_text

ROOT = Path(__file__).resolve().parents[1]

SLOW_JOB = job_text(name="slow", repeats=3, warmup=0, accuracy_rows=4, defaults={"heads": 4, "head_dim": 32},
                    cases=[{"name": "s", "grid": [64, 128], "patterns": [[1024, 1], [4096, 4]],
                            "sweep": {"ordering": ["natural", "hilbert"], "causal": [False, True]}}])


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMP_NUM_THREADS="1", HILBERT_HPC_THREADS="1")


def test_the_notice_reaches_the_launchers_stderr_when_the_signal_comes(monkeypatch, capfd):
    read, write = os.pipe()
    monkeypatch.setattr(signals, "launcher_stderr", lambda: write)
    monkeypatch.setattr(signals, "_prints", lambda: True)
    with signals.StopRequests(lambda: "3 of 8 cases are complete in r.h5; continue with 'run --resume'") as stops:
        os.kill(os.getpid(), signal.SIGTERM)
        ready, _, _ = select.select([read], [], [], 10)
        assert ready, "no notice within 10 s"
        line = os.read(read, 4096).decode()
        assert stops.received == signal.SIGTERM          # and the run still stops at the next boundary
        os.kill(os.getpid(), signal.SIGTERM)              # a second one (srun's and mpiexec's): said once, no error
        time.sleep(0.3)
        ready, _, _ = select.select([read], [], [], 0)
        assert not ready, os.read(read, 4096)
    os.close(read)
    assert "Exception ignored" not in capfd.readouterr().err
    assert line == ("hilbert-hpc: interrupted: mpiexec sent SIGTERM and ends the ranks now; 3 of 8 cases are complete "
                    "in r.h5; continue with 'run --resume' (to stop at a case boundary instead, send SIGUSR1 to "
                    "mpiexec)\n")


def test_no_notice_for_sigusr1_nor_outside_an_open_mpi_launcher(monkeypatch):
    assert signals.launcher_stderr() is None or "OMPI_COMM_WORLD_RANK" in os.environ
    read, write = os.pipe()
    monkeypatch.setattr(signals, "launcher_stderr", lambda: write)
    monkeypatch.setattr(signals, "_prints", lambda: True)
    with signals.StopRequests(lambda: "kept") as stops:
        os.kill(os.getpid(), signal.SIGUSR1)             # mpiexec forwards SIGUSR1 and waits: the boundary stop
        assert not select.select([read], [], [], 0.5)[0]
        assert stops.received == signal.SIGUSR1
    os.close(read)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec")
def test_ctrl_c_of_mpiexec_says_what_was_kept_and_how_to_continue(tmp_path):
    """SIGINT to mpiexec's process group, as a terminal's Ctrl-C sends it (the ranks have their own groups)."""
    (tmp_path / "job.toml").write_text(SLOW_JOB)
    proc = subprocess.Popen(["mpiexec", "-n", "2", "--oversubscribe", sys.executable, "-m", "hilbert_hpc", "run",
                             "job.toml", "-o", "c.h5"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    for line in proc.stdout:
        if line.startswith("0000-s"):
            os.killpg(proc.pid, signal.SIGINT)
            break
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    notices = [line for line in err.splitlines() if line.startswith("hilbert-hpc: interrupted")]
    assert len(notices) == 1, err
    assert "continue with 'run --resume'" in notices[0] and "Traceback" not in err
    said = int(notices[0].split("; ")[1].split(" of ")[0])
    with h5py.File(tmp_path / "c.h5") as f:
        kept = [cid for cid, g in f["cases"].items() if g.attrs.get("complete")]
    assert 1 <= said <= len(kept) < 4, (said, kept)
    assert f"{said} of 4 cases are complete in {tmp_path / 'c.h5'}" in notices[0] or \
        f"{said} of 4 cases are complete in c.h5" in notices[0]
    res = subprocess.run(["mpiexec", "-n", "2", "--oversubscribe", sys.executable, "-m", "hilbert_hpc", "run",
                          "job.toml", "-o", "c.h5", "--resume"], cwd=tmp_path, env=_env(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("skipped") == len(kept)
