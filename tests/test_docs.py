"""The documents the code and docs cite are in the repository, and the README lists every one of them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: where citations live: the package, the docs, the README, job files, batch scripts, probe scripts
CITING = [*sorted((ROOT / "hilbert_hpc").rglob("*.py")), *sorted((ROOT / "hilbert_hpc").rglob("*.cu*")),
          *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", *sorted((ROOT / "jobs").glob("*.toml")),
          *sorted((ROOT / "slurm").glob("*")), *sorted((ROOT / "tests" / "scripts").glob("*.py"))]


def _texts() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(errors="replace") for p in CITING if p.is_file()}


def test_no_citation_of_a_design_text_outside_the_repository():
    # the computation is specified in docs/semantics.md; a "DESIGN section" is nothing a user can open
    hits = [f"{name}:{text[:m.start()].count(chr(10)) + 1}" for name, text in _texts().items()
            for m in re.finditer(r"\bDESIGN\b", text)]
    assert not hits, f"cite docs/semantics.md (or another docs/ page) instead: {hits}"


def test_cited_docs_pages_exist():
    cited = {(name, page) for name, text in _texts().items() for page in re.findall(r"docs/([\w-]+\.md)", text)}
    missing = sorted(f"{name} -> docs/{page}" for name, page in cited if not (ROOT / "docs" / page).is_file())
    assert not missing, missing


def test_cited_semantics_sections_exist():
    headings = re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "semantics.md").read_text(), flags=re.M)
    sections = {int(h) for h in headings}
    assert sections == set(range(1, len(headings) + 1)), f"sections are numbered 1, 2, ...: {headings}"
    for name, text in _texts().items():
        for first, last in re.findall(r"docs/semantics\.md, sections? (\d+)(?:-(\d+))?", text):
            wanted = set(range(int(first), int(last or first) + 1))
            assert wanted <= sections, f"{name} cites docs/semantics.md section(s) {first}-{last or first}"


def test_readme_lists_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    docs_list = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    unlisted = sorted(p.name for p in (ROOT / "docs").glob("*.md") if f"`docs/{p.name}`" not in docs_list)
    assert not unlisted, f"README.md's documentation list lacks {unlisted}"


def test_named_package_paths_exist():
    """Every ``hilbert_hpc.x.y`` the docs, the README and the batch scripts name is a module or a name in one."""
    import importlib

    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "slurm").glob("*"))]
    named = {m for p in docs if p.is_file() for m in re.findall(r"\bhilbert_hpc(?:\.\w+)+", p.read_text())}
    missing = []
    for dotted in sorted(named):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr, None)
            if obj is None:
                missing.append(dotted)
            break
    assert not missing, f"named in the docs but not in the package: {missing}"
