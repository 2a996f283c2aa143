"""The runner is split into measurement, outputs and orchestration; the other modules use the layer they need."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STUDY = Path(__file__).resolve().parent.parent / "hilbert_hpc" / "study"


def _imports(module: str) -> set[tuple[str, str]]:
    """Every (module, name) that ``hilbert_hpc/study/<module>.py`` imports from the package, function-local ones
    too; the module named by its last component (``hilbert_hpc.study.runner`` -> ``runner``)."""
    tree = ast.parse((STUDY / f"{module}.py").read_text())
    return {((node.module or "").rpartition(".")[2], alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hilbert_hpc")
            for alias in node.names}


@pytest.mark.parametrize("module", ["maxlen", "plan", "measure", "case_outputs"])
def test_only_the_cli_imports_the_orchestration(module):
    """maxlen and plan take the case checks, inputs and accuracy from measure; nothing below runs the job."""
    assert not {m for m, _ in _imports(module)} & {"runner"}


def test_maxlen_uses_only_public_names_of_other_modules():
    assert not [(m, n) for m, n in _imports("maxlen") if n.startswith("_")]


def test_runner_keeps_its_documented_entry_points():
    from hilbert_hpc.study import runner, setup

    assert runner.check_case is setup.check_case
    assert callable(runner.run_case) and callable(runner.run_job)
