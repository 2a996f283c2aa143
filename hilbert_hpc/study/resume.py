"""What a ``--resume`` keeps: the job's identity, the checks of each complete case, the input files' SHA-256.

The old file is only read here; ``results.ResultsFile`` writes the resumed copy
(docs/results.md, "Resume").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hilbert_hpc.core.precision import precision
from hilbert_hpc.errors import UserError
from hilbert_hpc.study.jobfile import Case, Job, load_job
from hilbert_hpc.study.output_files import OutputError, io_error
from hilbert_hpc.study.parts import CHUNK_BYTES, output_problem
from hilbert_hpc.study.record import saved_datasets
from hilbert_hpc.study.results_read import READ_ERRORS, case_groups


def input_digest(path: str | Path) -> str:
    """SHA-256 of an input data file's bytes, read a few MiB at a time (OSError if it cannot be read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def input_digests(job: Job) -> dict[str, str]:
    """The SHA-256 of every input data file of ``job`` (each file read once); one line if one is unreadable."""
    digests: dict[str, str] = {}
    for case in job.cases:
        if case.input and str(case.input) not in digests:
            try:
                digests[str(case.input)] = input_digest(case.input)
            except OSError as exc:
                raise io_error(exc, "read the input file", case.input) from None
    return digests


def job_document(text: str) -> dict | None:
    """The parsed TOML of a job text (None if it does not parse): what identifies a job."""
    from hilbert_hpc.study.jobfile import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def job_fingerprint(text: str) -> str:
    """SHA-256 of the job's parsed content (comments and layout do not count)."""
    doc = job_document(text)
    canonical = json.dumps(doc, sort_keys=True, default=str) if doc is not None else text
    return hashlib.sha256(canonical.encode()).hexdigest()


def first_difference(old: Any, new: Any, where: str = "") -> str | None:
    """``where: <old> in the file, <new> here`` for the first key at which two parsed documents differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{where}.{key}" if where else str(key)
            if key not in old:
                return f"{sub} is not set in the file's job, {new[key]!r} here"
            if key not in new:
                return f"{sub} is {old[key]!r} in the file's job, not set here"
            found = first_difference(old[key], new[key], sub)
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if old == new else f"{where} is {old!r} in the file, {new!r} here"


def plan_resume(src: h5py.File, path: Path, job: Job, inputs: dict[str, str],
                ranks: int | None = None) -> tuple[list[str], list[str]]:
    """The complete, sound cases of ``src`` to keep, and notes on what runs again; OutputError if not this job.

    Refused (nothing changes on disk): a file of another program, of another job
    (name or content, naming the first difference), whose complete cases have
    other parameters than this run's (naming the parameter, ``ranks`` first; and
    naming the rank count when this run's, ``ranks``, gives the job other cases
    than the file's last run had), or whose complete cases read an input file
    that has changed since (``inputs``: its SHA-256 now).
    """
    where = f"cannot resume {str(path)!r}"
    if src.attrs.get("program") != "hilbert-hpc" or not isinstance(src.get("cases"), h5py.Group):
        raise OutputError(f"{where}: not a hilbert-hpc results file", "output")
    name = src.attrs.get("job_name")
    if name != job.name:
        raise OutputError(f"{where}: it holds job {name!r}, this is job {job.name!r}; resume only with the same "
                          f"job, or write to another file with -o", "output")
    text = src.attrs.get("job_text", "")
    stored = src.attrs.get("job_fingerprint") or job_fingerprint(text)
    if stored != job_fingerprint(job.text):
        old, new = job_document(text), job_document(job.text)
        diff = first_difference(old, new) if old is not None and new is not None else None
        raise OutputError(f"{where}: it was written by another version of job {job.name!r} "
                          f"({diff or 'the job text differs'}); resume only with the same job, or write to "
                          f"another file with -o", "output")
    by_id = {c.case_id: c for c in job.cases}
    keep, notes = [], []
    for cid, group, why in case_groups(src["cases"], [c.case_id for c in job.cases]):
        try:
            if group is None:
                raise RuntimeError(why)
            complete = bool(group.attrs.get("complete", False))
            params = group.attrs.get("params_json") if complete else None
        except READ_ERRORS as exc:
            notes.append(f"case {cid}: it is unreadable ({exc}); it runs again")
            continue
        if not complete:
            notes.append(f"case {cid} was unfinished; it runs again")
            continue
        case = by_id.get(cid)
        if case is None and (backend := str(group.attrs.get("backend", ""))) in job.optional_backends:
            keep.append(cid)                # a peer this run leaves out (cannot run or fit here): its result stays
            notes.append(f"case {cid} of optional backend {backend!r} is left out of this run; the file's result "
                         f"is kept")
            continue
        if case is None:
            _refuse_other_rank_count(src, job, ranks, where, f"it holds case {cid}, which this run does not have")
            raise OutputError(f"{where}: it holds case {cid}, which this run of job {job.name!r} does not have "
                              f"(another rank count?); resume with the same job and ranks, or write to another "
                              f"file with -o", "output")
        theirs = json.loads(params) if isinstance(params, str) else {}
        theirs.setdefault("pass", "forward")         # files from before the backward were forward-only
        theirs.setdefault("placement", "auto")       # files from before placements: the job asked for nothing
        theirs.setdefault("long_schedule", "auto")   # files from before long-pattern schedules: likewise
        ours = case.params()
        differ = sorted((k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k)),
                        key=lambda k: (k != "ranks", k))
        if differ:
            k = differ[0]
            found = f"case {cid} has {k} = {theirs.get(k)!r} in the file, {ours.get(k)!r} in this run"
            _refuse_other_rank_count(src, job, ranks, where, found)
            raise OutputError(f"{where}: {found}; resume only with the same job and ranks, or write to another "
                              f"file with -o", "output")
        _refuse_changed_input(group, case, inputs, where)
        problem = _case_problem(group, case, job, path, src.attrs.get("results_id"))
        if problem:
            notes.append(f"case {cid}: {problem}; it runs again")
            continue
        keep.append(cid)
    return keep, notes


def last_run_ranks(src: h5py.File) -> int | None:
    """The rank count of the last run that wrote ``src`` (its last ``resumes`` entry, else the root's ``ranks``)."""
    try:
        runs = [src.attrs.get("ranks")] + [entry.get("ranks") for entry in json.loads(src.attrs.get("resumes", "[]"))]
        found = [int(r) for r in runs if r is not None]
    except (TypeError, ValueError, AttributeError):
        return None
    return found[-1] if found else None


def _rank_text(count: int) -> str:
    return f"{count} rank" + ("" if count == 1 else "s")


def _refuse_other_rank_count(src: h5py.File, job: Job, ranks: int | None, where: str, found: str) -> None:
    """Refuse, naming the rank count, a resume on ``ranks`` ranks where the file's last run had another count that
    gives the job other cases (``ranks = "pow2"`` or ``"all"``: the case ids shift with the rank count)."""
    before = last_run_ranks(src)
    if ranks is None or before is None or before == ranks:
        return
    try:
        then, now = (load_job(job.path, text=job.text, world_size=size).cases for size in (before, ranks))
    except UserError:
        return
    if [(c.case_id, c.params()) for c in then] == [(c.case_id, c.params()) for c in now]:
        return                                  # the same cases on either rank count: not the cause
    raise OutputError(f"{where}: it was run on {_rank_text(before)}, this run has {ranks}, which gives job "
                      f"{job.name!r} other cases ({found}); resume on {_rank_text(before)}, or write to another "
                      f"file with -o", "output")


def _refuse_changed_input(group: h5py.Group, case: Case, inputs: dict[str, str], where: str) -> None:
    """Refuse to resume a complete case whose input file's SHA-256 differs from the one it recorded."""
    if not case.input:
        return
    recorded = group.attrs.get("input_sha256", "")
    if recorded and recorded != inputs.get(str(case.input)):
        raise OutputError(f"{where}: input file {str(case.input)!r} of case {case.case_id} has changed since the "
                          f"case ran (its SHA-256 differs from the one recorded); restore the file, or start over "
                          f"with --overwrite or another -o", "output")


def _case_problem(group: h5py.Group, case: Case, job: Job, path: Path, results_id: str | None) -> str | None:
    """Why a complete case cannot be trusted, or None: the one definition of a case complete enough to keep.

    It has its timings, metrics and accuracy; the checksum of its input file, if
    it reads one; and, when the job saves outputs, every dataset its pass saves
    (``record.saved_datasets``: the output, and the gradients of a
    forward+backward case) with the case's shape and dtype, checksummed, and
    passing :func:`parts.output_problem`.
    """
    try:
        for name in ("timings", "metrics", "accuracy"):
            if name not in group:
                return f"its {name} are missing"
        group["timings/attention"][()]
        if case.input and not group.attrs.get("input_sha256", ""):
            return "it recorded no checksum of its input file (an earlier version wrote it)"
        if not job.save_output:
            return None
        shape = (case.batch, case.tokens, case.heads, case.head_dim)
        stored = np.dtype(precision(case.dtype).file_dtype)
        for name in saved_datasets(case.pass_):
            if name not in group:
                return f"its saved {name} is missing"
            ds = group[name]
            if ds.shape != shape or ds.dtype != stored:
                return f"its {name} is {ds.shape} {ds.dtype}, expected {shape} {stored}"
            if not results_id or not json.loads(ds.attrs.get("part_sha256", "[]")):
                return f"its {name} parts carry no checksum (an earlier version wrote them)"
        return output_problem(group, path, results_id)
    except READ_ERRORS as exc:
        return f"it is unreadable ({exc})"
