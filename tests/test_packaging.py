"""What a normal install gets: a wheel built from the tracked files ships every file of the package, and its
kernel sources read (headers inlined) from the installed copy; the README's install stays lean."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked_files() -> list[str]:
    """The files git tracks in this checkout (skips outside a git checkout, e.g. an unpacked sdist)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know the tracked files")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [name for name in out.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the tracked files (as .ci/check-wheel does), offline when setuptools can."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in tracked_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    offline = ["--no-build-isolation"] if importlib.util.find_spec("setuptools.command.bdist_wheel") else []
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                          *offline, "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (found,) = (tmp / "dist").glob("hilbert_hpc-*.whl")
    return found


def test_wheel_ships_every_file_of_the_package(wheel):
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = [n for n in tracked_files() if n.startswith("hilbert_hpc/")]
    assert [n for n in wanted if n not in shipped] == []
    assert {"hilbert_hpc/kernels/common.cuh", "hilbert_hpc/kernels/attention.cuh"} <= shipped


def test_installed_kernel_sources_read_from_the_installed_package(wheel, tmp_path):
    """Every kernel source, headers inlined, from the unpacked wheel and nowhere else (no NVRTC needed)."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import sys, hilbert_hpc.kernels.program as k\n"
             "assert k.KERNEL_DIR == __import__('pathlib').Path(sys.argv[1]).resolve() / 'hilbert_hpc' / 'kernels'\n"
             "for cu in sorted(k.KERNEL_DIR.glob('*.cu')):\n"
             "    text = k.source(cu.name)\n"
             "    assert not any(f'#include \"{h}\"' in text for h in k.HEADERS), cu.name\n"
             "    print(cu.name)\n")
    run = tmp_path / "run"
    run.mkdir()
    res = subprocess.run([sys.executable, "-c", probe, str(site)], cwd=run, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=str(site)))
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.split()) == len(list((ROOT / "hilbert_hpc" / "kernels").glob("*.cu")))


def _extras(line: str) -> set[str]:
    match = re.search(r"-e '\.\[([^\]]*)\]'", line)
    assert match, line
    return set(match.group(1).split(","))


def test_readme_install_is_lean_and_ci_adds_only_nvrtc():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Set-up: two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, "one command sets up and runs the quickstart, one runs the whole suite"
    install, suite = commands
    assert "hilbert-hpc run jobs/quickstart.toml" in install and "mpiexec -n 2" in install
    ci = (ROOT / ".ci" / "run").read_text()
    ci_install = next(line for line in ci.splitlines() if "pip install" in line)
    assert "nvrtc" not in _extras(install)
    assert _extras(ci_install) == _extras(install) | {"nvrtc"}
    assert suite in ci.splitlines() and "bash .ci/check-wheel" in ci.splitlines()
