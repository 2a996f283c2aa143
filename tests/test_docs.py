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


# The README's "Using it" block: a user pastes it after the set-up, top to bottom.

def _bash_block(heading: str) -> list[str]:
    """The non-blank, non-comment lines of the first ```bash block under ``## heading`` in the README."""
    section = (ROOT / "README.md").read_text().split(f"## {heading}", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _command(line: str) -> tuple[int, list[str], bool]:
    """(ranks, argv from the program on, marked ``# GPU``) of one README line; its launcher and ``eval`` removed."""
    import shlex

    command, comment = (*re.split(r"\s#\s", line, maxsplit=1), "")[:2]
    argv = shlex.split(command.split("&&")[-1])
    if argv[0] == "eval":
        argv = shlex.split(argv[1].removeprefix("$(").removesuffix(")"))
    ranks = 1
    if argv[0] in ("mpirun", "mpiexec", "srun"):
        ranks = int(argv[argv.index("-n") + 1])
        argv = argv[argv.index("hilbert-hpc"):]
    return ranks, argv, bool(re.match(r"GPU\b", comment.strip()))


def _using_it() -> list[tuple[str, int, list[str], bool]]:
    """Every line of "Using it" as (line, ranks, argv, marked GPU), after the set-up's quickstart run."""
    setup = _bash_block("Set-up: two commands")[0]
    return [(line, *_command(line)) for line in [setup, *_bash_block("Using it")]]


def _job_needs_gpu(job: str, ranks: int) -> bool:
    from hilbert_hpc.backends import find_backend
    from hilbert_hpc.study.jobfile import load_job

    return any(find_backend(case.backend).on_gpu for case in load_job(ROOT / job, world_size=ranks).cases)


def test_readme_usage_names_existing_files():
    named = {tok for _, _, argv, _ in _using_it() for tok in argv if re.match(r"(jobs|slurm)/", tok)}
    assert named, "the Using-it block names job files"
    missing = sorted(name for name in named if not (ROOT / name).is_file())
    assert not missing, f"README.md's Using-it block names missing files: {missing}"


def test_readme_usage_lines_are_accepted_by_the_cli():
    from hilbert_hpc.cli import build_parser

    for line, _, argv, _ in _using_it():
        assert argv[0] in ("hilbert-hpc", "sbatch"), f"a README line that runs neither hilbert-hpc nor sbatch: {line}"
        if argv[0] == "hilbert-hpc":
            try:
                build_parser().parse_args(argv[1:])
            except SystemExit:
                raise AssertionError(f"hilbert-hpc refuses the README line: {line}") from None


def test_readme_usage_runs_top_to_bottom():
    """Each results file is new where written (or continued, on the ranks that wrote it), as pasted in order."""
    from hilbert_hpc.cli import build_parser
    from hilbert_hpc.study.jobfile import load_job
    from hilbert_hpc.study.maxlen import load_search

    written: dict[str, int] = {}
    for line, ranks, argv, _ in _using_it():
        if argv[0] == "sbatch":
            output, resume, overwrite = load_job(ROOT / argv[2]).output, False, False
        elif argv[0] == "hilbert-hpc" and argv[1] in ("run", "maxlen", "bandwidth"):
            args = build_parser().parse_args(argv[1:])
            output = args.output or {"run": lambda: load_job(ROOT / args.job).output,
                                     "maxlen": lambda: load_search(ROOT / args.study).output,
                                     "bandwidth": lambda: None}[argv[1]]()
            resume, overwrite = getattr(args, "resume", False), args.overwrite
        else:
            continue
        if output is None:
            continue
        if resume:
            assert written.get(output) == ranks, f"nothing written by {ranks} rank(s) to {output} to resume: {line}"
        else:
            assert output not in written or overwrite, f"{output} was written by an earlier line: {line}"
        written[output] = ranks


def test_readme_usage_marks_the_gpu_lines():
    from hilbert_hpc.backends import find_backend
    from hilbert_hpc.cli import build_parser
    from hilbert_hpc.study.maxlen import load_search

    for line, ranks, argv, marked in _using_it()[1:]:
        if argv[0] == "sbatch":
            needs = _job_needs_gpu(argv[2], ranks)
        else:
            args = build_parser().parse_args(argv[1:])
            needs = {"run": lambda: _job_needs_gpu(args.job, ranks),
                     "maxlen": lambda: any(find_backend(b).on_gpu for b in load_search(ROOT / args.study).backends),
                     "bandwidth": lambda: args.device == "gpu",
                     "cuda-env": lambda: True}.get(argv[1], lambda: False)()
        assert marked == needs, f"{'mark' if needs else 'unmark'} this README line '# GPU': {line}"


def test_kernels_header_table_lists_every_header_in_include_order():
    from hilbert_hpc.kernels.program import HEADERS

    section = (ROOT / "docs" / "kernels.md").read_text().split("## Kernel headers", 1)[1].split("\n## ", 1)[0]
    table = re.findall(r"^\| `([\w.]+\.cuh)` \|", section, flags=re.M)
    on_disk = sorted(p.name for p in (ROOT / "hilbert_hpc" / "kernels").glob("*.cuh"))
    assert sorted(HEADERS) == on_disk, "kernels.program.HEADERS inlines every header"
    assert table == list(HEADERS), f"docs/kernels.md's header table, in program.HEADERS' order: {list(HEADERS)}"


def test_kernels_doc_counts_the_instantiations_ci_compiles():
    from hilbert_hpc.kernels.registry import instantiations

    counts = re.findall(r"(\d+) instantiations", (ROOT / "docs" / "kernels.md").read_text())
    assert counts, "docs/kernels.md says how many instantiations CI compiles"
    assert set(counts) == {str(len(instantiations()))}, "the number of registry.instantiations() (kernels.check)"


def test_semantics_says_where_the_backward_crosses_ranks():
    """The backward section's heading names the devices whose backends have a ring backward."""
    from hilbert_hpc.backends import BACKENDS
    from hilbert_hpc.backends.base import Backend

    ring = [cls for cls in BACKENDS.values() if cls.ring_backward_kernels is not Backend.ring_backward_kernels]
    heading = re.search(r"^## \d+\. Backward \((.*)\)$", (ROOT / "docs" / "semantics.md").read_text(), re.M)
    assert heading, "docs/semantics.md has a section '## N. Backward (...)'"
    across = heading.group(1).split("across ranks", 1)
    assert len(across) == 2, f"the heading says where the backward crosses ranks: {heading.group(0)}"
    for device, on_gpu in (("CPU", False), ("GPU", True)):
        has = any(cls.on_gpu == on_gpu for cls in ring)
        assert (device in heading.group(1)) == has, f"{device} backends {'have' if has else 'lack'} a ring backward"


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_performance_current_figures_are_copied_from_the_sections_they_link():
    text = (ROOT / "docs" / "performance.md").read_text()
    headings = list(re.finditer(r"^## (.*)$", text, flags=re.M))
    sections = {_github_anchor(m.group(1)): text[m.end():].split("\n## ", 1)[0] for m in headings}
    found = re.search(r"<!-- current figures: begin -->\n(.*?)<!-- current figures: end -->", text, re.S)
    assert found and headings[0].group(1) == "Current figures" and found.end() < headings[1].start(), \
        "performance.md opens with its current figures"
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in found.group(1).splitlines()[2:]]
    assert rows and all(len(row) == 4 for row in rows)
    for what, figure, device_date, link in rows:
        anchor = re.fullmatch(r"\[[^\]]+\]\(#([\w-]+)\)", link)
        assert anchor and anchor.group(1) in sections, f"{what}: no section {link}"
        section = sections[anchor.group(1)]
        date = re.search(r"\d{4}-\d{2}-\d{2}", device_date)
        assert date and date.group(0) in section, f"{what}: the section is not of {device_date}"
        for number in re.findall(r"\d+(?:[.,]\d+)*", figure + device_date.replace(date.group(0), "")):
            assert re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", section), \
                f"{what}: {number} is not in its section"
