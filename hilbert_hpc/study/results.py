"""HDF5 results: provenance at the root, one group per case under ``/cases``.

Layout (docs/results.md)::

    /                     attrs: program, version, git_hash, command_line, job_text, job_path,
                                 started_utc, finished_utc, host, cpu, versions (JSON), gpus (JSON), ...
    /cases/<case-id>/     attrs: every case parameter, complete (bool), finished_utc
        timings/<name>    float64 (ranks, repeats): phases and ring counters in seconds, bytes_sent in B
        metrics           attrs: tokens_per_s, useful_tflops, ... (median over repeats)
        accuracy          attrs: rows, max_abs_err, max_rel_err, rel_l2_err (vs float64 reference)
        output            (B, N, H, Dv) in natural order, only when the job saves outputs: a virtual
                          dataset over the part files in ``<results file name>.parts/``, which carry
                          the results file's ``results_id`` and whose SHA-256 the case records

The file under its final name is never modified in place: each change is
written to a copy under a temporary name and renamed over it (``ResultsFile``),
so a run stopped at any moment leaves a consistent file of complete cases.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import h5py
import numpy as np

from hilbert_hpc.study.jobfile import Case, Job
from hilbert_hpc.core.precision import precision
from hilbert_hpc.study.output_files import (IO_ERRORS, OutputError, OutputLock, existing_output, io_error, make_parent,
                           move_into_place, os_reason, refuse_protected, remove_quietly, replace_hdf5,
                           temporary_name)
from hilbert_hpc.study.provenance import utc_now


def hdf5_attr(value: Any) -> Any:
    """Convert a Python value to something h5py stores as an attribute."""
    if isinstance(value, (dict, list, tuple)) and not (
        isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value)
    ):
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
            return np.asarray(value)
        return json.dumps(value)
    if value is None:
        return ""
    return value




def params_json(case: Case) -> str:
    """Canonical text of a case's parameters: what resuming matches on."""
    return json.dumps(case.params(), sort_keys=True)


#: suffix of the folder of a results file's output parts
PARTS_SUFFIX = ".parts"
#: the file in a parts folder that names the results file (by its ``results_id``) the folder belongs to
OWNER_FILE = "OWNER"
#: bytes read at a time when checksumming (input files, output parts)
CHUNK_BYTES = 1 << 24


def parts_dir(results_path: Path) -> Path:
    """Folder of the per-rank output files of a results file: its whole name + ``.parts`` (``x.h5`` ->
    ``x.h5.parts``), so that ``x.h5``, ``x.hdf5`` and ``x`` never share one.

    Files of earlier versions used ``<stem>.parts``; their cases name their part
    files (relative to the results file), so they stay readable.
    """
    results_path = Path(results_path)
    return results_path.with_name(results_path.name + PARTS_SUFFIX)


def new_results_id() -> str:
    """A random identity for a new results file, stored at its root and in each of its output parts."""
    return uuid.uuid4().hex


def parts_owner(parts: Path) -> str | None:
    """The ``results_id`` that the parts folder's OWNER file names; None when there is none (no folder, a
    symbolic link, no or an unreadable OWNER file)."""
    try:
        if parts.is_symlink() or not parts.is_dir():
            return None
        lines = (parts / OWNER_FILE).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    found = [line.split()[1] for line in lines if line.startswith("results_id ") and len(line.split()) == 2]
    return found[0] if found else None


def make_parts_dir(results_path: Path, results_id: str) -> None:
    """Create the parts folder of ``results_path`` (if missing) and name its owner; call with the lock held.

    Raises what the file system raised (OSError).
    """
    parts = parts_dir(results_path)
    parts.mkdir(exist_ok=True)
    owner = parts / OWNER_FILE
    tmp = temporary_name(owner)
    try:
        tmp.write_text(f"output parts of the hilbert-hpc results file {results_path.name}\n"
                       f"results_id {results_id}\n")
        move_into_place(tmp, owner)
    except BaseException:
        remove_quietly(tmp)
        raise


def refuse_foreign_parts(parts: Path, results_path: Path, results_id: str | None) -> None:
    """Refuse a parts folder that is a symbolic link, or (``results_id`` given) that names another owner.

    Parts are written only into a real folder that belongs to this results file,
    so two results files can never exchange outputs.
    """
    if parts.is_symlink():
        raise OutputError(f"{str(parts)!r} is a symbolic link; output parts are written only into a real folder "
                          f"next to {results_path.name!r}: replace the link by a folder, or write to another "
                          f"file with -o", "output")
    if results_id is not None and parts.exists() and parts_owner(parts) != results_id:
        raise OutputError(f"{str(parts)!r} does not belong to {results_path.name!r} (its {OWNER_FILE} file names "
                          f"another results file, or is missing); move it away, or write to another file with -o",
                          "output")


def block_digest(block: np.ndarray) -> str:
    """SHA-256 of an output block's bytes (C order, as stored): what a part's checksum is."""
    return hashlib.sha256(np.ascontiguousarray(block).reshape(-1).view(np.uint8)).hexdigest()


def _stored_digest(ds: h5py.Dataset, lo: int, hi: int) -> str:
    """:func:`block_digest` of ``ds[:, lo:hi]``, read a few MiB at a time."""
    digest = hashlib.sha256()
    row = max(1, int(np.prod(ds.shape[2:], dtype=np.int64)) * ds.dtype.itemsize)
    step = max(1, CHUNK_BYTES // row)
    for b in range(ds.shape[0]):
        for t in range(lo, hi, step):
            digest.update(np.ascontiguousarray(ds[b, t:min(hi, t + step)]).reshape(-1).view(np.uint8))
    return digest.hexdigest()


def output_problem(group: h5py.Group, results_path: Path, results_id: str | None) -> str | None:
    """Why a case's saved output cannot be trusted, naming the part, or None: the one check of resume and report.

    Every part file the case's ``output`` lists must be there, readable, of the
    right shape and dtype, belong to this results file (``results_id``) and this
    case, and its data must match the SHA-256 the case recorded for each rank's
    block. Cases of earlier versions (no ``results_id``, no checksums) are checked
    for presence, shape and dtype only.
    """
    cid = group.name.rsplit("/", 1)[-1]
    try:
        ds = group["output"]
        files = json.loads(ds.attrs.get("parts", "[]"))
        digests = json.loads(ds.attrs.get("part_sha256", "[]"))
        if not files:
            return "its output lists no parts"
        batch, tokens, *row = ds.shape
        ranks = len(digests) or len(files)
        if len(files) not in (1, ranks) or tokens % ranks:
            return f"its output lists {len(files)} part(s) for {ranks} rank(s)"
        shard = tokens // ranks
        for i, part in enumerate(files):
            blocks = [(r, r * shard) for r in range(ranks)] if len(files) == 1 else [(i, 0)]
            expected = (batch, tokens if len(files) == 1 else shard, *row)
            problem = _part_problem(results_path.parent / part, part, cid, expected, ds.dtype, results_id,
                                    [(lo, lo + shard, digests[r]) for r, lo in blocks] if digests else [])
            if problem:
                return problem
    except READ_ERRORS as exc:
        return f"its output is unreadable ({os_reason(exc)})"
    return None


def _part_problem(file: Path, part: str, cid: str, shape: tuple[int, ...], dtype: np.dtype,
                  results_id: str | None, blocks: list[tuple[int, int, str]]) -> str | None:
    """What is wrong with one output part file (see :func:`output_problem`), or None."""
    if not file.is_file():
        return f"output part {part} is missing"
    try:
        with h5py.File(file, "r") as f:
            out = f.get("output")
            if not isinstance(out, h5py.Dataset):
                return f"output part {part} holds no output"
            if out.shape != shape or out.dtype != dtype:
                return f"output part {part} is {out.shape} {out.dtype}, expected {shape} {dtype}"
            if results_id is not None and (out.attrs.get("results_id") != results_id
                                           or out.attrs.get("case_id") != cid):
                return f"output part {part} belongs to another results file or case"
            for lo, hi, digest in blocks:
                if _stored_digest(out, lo, hi) != digest:
                    return f"output part {part} is damaged (its data does not match the SHA-256 the case recorded)"
    except READ_ERRORS as exc:
        return f"output part {part} is unreadable ({os_reason(exc)})"
    return None


def output_notes(path: str | Path) -> list[str]:
    """A note for each complete case of a results file whose saved output is lost or damaged (for ``report``)."""
    path = Path(path)
    notes = []
    try:
        with h5py.File(path, "r") as h5:
            results_id = h5.attrs.get("results_id")
            for cid, group, _ in case_groups(h5["cases"]):
                if group is None or not group.attrs.get("complete", False) or "output" not in group:
                    continue
                problem = output_problem(group, path, results_id)
                if problem:
                    notes.append(f"{str(path)!r}, case {cid}: {problem}; its saved output cannot be trusted "
                                 f"(NaN where a part is missing); its timings and accuracy are unaffected")
    except READ_ERRORS:
        return notes              # an unreadable file or list of cases: the reader says so itself
    return notes


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


#: what h5py raises for an object it cannot read (damage, or a write cut off by a full disk)
READ_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)


def case_groups(cases: h5py.Group, names: Iterable[str] = ()) -> Iterator[tuple[str, h5py.Group | None, str]]:
    """``(case id, group, "")`` for each case of a results file, ``(case id, None, why)`` for unreadable ones.

    Goes by name, so one damaged case does not hide the others. If the list of
    cases itself cannot be read, the cases called ``names`` are looked up one by
    one instead (a resume knows its job's case ids); with no names the read error
    is raised.
    """
    try:
        ids = list(cases)
    except READ_ERRORS:
        if not names:
            raise
        ids = [n for n in names if _exists(cases, n)]
    for cid in ids:
        try:
            group = cases[cid]
            if not isinstance(group, h5py.Group):
                raise TypeError("not a group")
            group.attrs.get("complete")
        except READ_ERRORS as exc:
            yield cid, None, str(exc)
            continue
        yield cid, group, ""


def _exists(group: h5py.Group, name: str) -> bool:
    try:
        return name in group
    except READ_ERRORS:
        return False


def is_results_file(path: Path) -> bool:
    """True when ``path`` is an HDF5 file written by ``hilbert-hpc run`` (program attribute and /cases)."""
    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get("program") == "hilbert-hpc" and isinstance(f.get("cases"), h5py.Group)
    except Exception:  # noqa: BLE001 - not HDF5, damaged beyond opening, or unreadable: not one of ours
        return False


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


class ResultsFile:
    """One results file, owned (locked) by the rank that writes it, from creation or resume to close.

    Use :meth:`open`: it refuses what must not be written, takes the lock, and
    either creates a new file or continues an existing one (``resume``). The
    file under its final name is never modified in place: every change (the
    header, each case, the finish time) is made on a copy under a temporary
    name, which is closed, synced and renamed over it. So the final name always
    holds a closed, consistent HDF5 file, whatever stops the run (a full disk,
    SIGKILL, a node failure), and other programs can read it while a job runs.
    """

    KIND = "hilbert-hpc results file"

    def __init__(self, path: Path, lock: OutputLock) -> None:
        self.path, self.lock = path, lock
        self.kept: list[str] = []
        self.notes: list[str] = []
        #: identity of the file, at its root and in each of its output parts
        self.results_id = new_results_id()
        #: SHA-256 of each input data file of the job (path -> digest), recorded with the cases that read it
        self.inputs: dict[str, str] = {}
        #: makes the new file (header, fresh parts folder) when the run first has a case to commit
        self._start: Callable[[], None] | None = None
        self.started = False

    @classmethod
    def open(cls, path: str | Path, job: Job, provenance: dict[str, Any], resume: bool = False,
             overwrite: bool = False) -> "ResultsFile":
        """Own ``path`` for a run of ``job``: refusals, lock, then a new file or the resumed one.

        The output may never be the job file, an input file, a folder or a file
        that is not a results file. An existing results file is continued with
        ``resume`` or replaced with ``overwrite`` (its ``.parts`` folder too),
        and refused otherwise. A refused resume changes nothing on disk, and
        neither does a replacing run refused before its first case: the old file
        and its parts are replaced only by :meth:`begin`, when the run has a case
        to commit. A new file is created at once.
        """
        path = Path(path)
        protected = [(job.path, "job file")] + [(c.input, f"input file of case {c.case_id}") for c in job.cases]
        refuse_protected(path, protected, derived=[PARTS_SUFFIX])
        make_parent(path)
        results = cls(path, OutputLock(path).acquire())
        try:
            exists = existing_output(path, is_results_file, cls.KIND)
            parts = parts_dir(path)
            if exists and not (resume or overwrite):
                raise OutputError(f"{str(path)!r} already holds results; continue it with --resume, replace it "
                                  f"with --overwrite, or write to another file with -o", "output")
            refuse_foreign_parts(parts, path, None)
            if parts.exists() and not exists and not overwrite:
                raise OutputError(f"{str(parts)!r} exists without its results file {path.name!r}; remove it or "
                                  f"use --overwrite", "output")
            if overwrite:
                _check_parts_are_ours(parts)
            results.inputs = input_digests(job)
            if exists and resume:
                results._resume(job, provenance)
                return results
            results._start = lambda: results._start_new(job, provenance)
            if not exists:
                results.begin()
            return results
        except BaseException:
            results.lock.release()
            raise

    def begin(self) -> None:
        """Make the new file, once: the header, the old ``.parts`` folder removed, a fresh one (saved outputs).

        A replacing run (``--overwrite``) calls it when it has its first case to
        commit (before that case's output parts are written), so a run refused
        before then leaves the old file and its parts exactly as they were.
        """
        if self._start is not None:
            self._start()
            self._start = None

    def _start_new(self, job: Job, provenance: dict[str, Any]) -> None:
        """The header of a new file under the final name, then its parts folder (old parts removed)."""
        self._replace(lambda h5: _write_header(h5, job, provenance, self.results_id), "create results file")
        self.started = True
        parts = parts_dir(self.path)
        if parts.exists():
            try:
                shutil.rmtree(parts)
            except OSError as exc:
                raise io_error(exc, "remove the old output parts", parts) from None
        if job.save_output:
            try:
                make_parts_dir(self.path, self.results_id)
            except OSError as exc:
                raise io_error(exc, "create the output parts folder", parts) from None

    def _replace(self, fill: Callable[[h5py.File], None], what: str, start_from_current: bool = False,
                 hint: str = "") -> None:
        """The next version of the file (:func:`output_files.replace_hdf5`); one line naming ``what`` failed."""
        try:
            replace_hdf5(self.path, fill, start_from_current)
        except IO_ERRORS as exc:
            raise io_error(exc, what, self.path, hint) from None

    def _resume(self, job: Job, provenance: dict[str, Any]) -> None:
        """Check the old file read-only; if it is this job's, write a copy holding its sound complete cases."""
        try:
            src = h5py.File(self.path, "r")
        except OSError as exc:
            raise OutputError(f"cannot resume {str(self.path)!r}: not a readable HDF5 file ({exc})",
                              "output") from None
        with src:
            old_id = src.attrs.get("results_id")
            if old_id:
                self.results_id = str(old_id)
                refuse_foreign_parts(parts_dir(self.path), self.path, self.results_id)
            keep, notes = _plan_resume(src, self.path, job, self.inputs)

            def fill(h5: h5py.File) -> None:
                for key, value in src.attrs.items():
                    h5.attrs[key] = value
                h5.attrs["job_fingerprint"] = job_fingerprint(job.text)
                h5.attrs["results_id"] = self.results_id
                resumes = json.loads(src.attrs.get("resumes", "[]"))
                resumes.append({"started_utc": provenance.get("started_utc"),
                                "command_line": provenance.get("command_line"),
                                "ranks": provenance.get("ranks"), "hosts": provenance.get("hosts")})
                h5.attrs["resumes"] = json.dumps(resumes)
                cases = h5.create_group("cases")
                for cid in keep:
                    try:
                        src.copy(src["cases"][cid], cases, name=cid)
                        self.kept.append(cid)
                    except READ_ERRORS as exc:
                        if cid in cases:
                            del cases[cid]
                        notes.append(f"case {cid}: it is unreadable ({exc}); it runs again")

            self._replace(fill, "write the resumed results file")
        self.started = True
        if job.save_output:
            try:
                make_parts_dir(self.path, self.results_id)
            except OSError as exc:
                raise io_error(exc, "create the output parts folder", parts_dir(self.path)) from None
        self.notes = notes

    def write_case(self, case: Case, record: dict[str, Any], output_parts: list[str] | None = None,
                   output_shape: tuple[int, ...] | None = None, shard: int | None = None,
                   part_digests: list[str] | None = None) -> None:
        """Store one case (parameters, timings, metrics, accuracy, optional output), marked complete.

        ``output_parts`` are the ranks' output files (paths relative to this file,
        rank order): one per rank, each holding ``shard`` natural-order tokens, or
        the same shared file from every rank (parallel HDF5). The case's ``output``
        is a virtual dataset over them, in natural order; ``part_digests`` are the
        SHA-256 of each rank's block (:func:`block_digest`). The SHA-256 of the
        case's input file is recorded too. A failing write (a full disk) raises
        OutputError and leaves the file as it was. The first case starts the new
        file (:meth:`begin`).
        """
        self.begin()
        extra = {"input_sha256": self.inputs.get(str(case.input), "")} if case.input else {}
        self._replace(lambda h5: _write_case(h5, case, record, output_parts, output_shape, shard, part_digests,
                                             extra),
                      "write results file", start_from_current=True,
                      hint="its complete cases are kept; free some space and continue with --resume")

    def close(self, quiet: bool = False) -> None:
        """Record the finish time and release the lock.

        Failing to record the time is a warning (nothing with ``quiet``, when the
        run already ends with an error that says why). A replacing run that never
        began its file leaves the old one untouched.
        """
        if not self.started:
            self.lock.release()
            return
        try:
            self._replace(lambda h5: h5.attrs.__setitem__("finished_utc", utc_now()), "finish",
                          start_from_current=True)
        except OutputError as exc:
            if not quiet:
                print(f"hilbert-hpc: warning: {exc}", file=sys.stderr, flush=True)
        finally:
            self.lock.release()


def _write_header(h5: h5py.File, job: Job, provenance: dict[str, Any], results_id: str) -> None:
    """The root of a new results file: provenance, the job, its identity, an empty /cases."""
    for key, value in provenance.items():
        h5.attrs[key] = hdf5_attr(value)
    h5.attrs["results_id"] = results_id
    h5.attrs["job_name"] = job.name
    h5.attrs["job_path"] = job.path
    h5.attrs["job_text"] = job.text
    h5.attrs["job_fingerprint"] = job_fingerprint(job.text)
    h5.attrs["job_settings"] = json.dumps(job.settings)
    h5.attrs["resumes"] = "[]"
    h5.create_group("cases")


def _write_case(h5: h5py.File, case: Case, record: dict[str, Any], output_parts: list[str] | None,
                output_shape: tuple[int, ...] | None, shard: int | None, part_digests: list[str] | None = None,
                extra: dict[str, Any] | None = None) -> None:
    """One case group (see :meth:`ResultsFile.write_case`)."""
    group = h5["cases"].create_group(case.case_id)
    group.attrs["params_json"] = params_json(case)
    for key, value in case.params().items():
        group.attrs[key] = hdf5_attr(value)
    for key, value in (extra or {}).items():
        group.attrs[key] = value
    for key, value in record.get("attrs", {}).items():
        group.attrs[key] = hdf5_attr(value)
    timings = group.create_group("timings")
    for phase, values in record["timings"].items():
        ds = timings.create_dataset(phase, data=np.asarray(values, dtype=np.float64))
        ds.attrs["units"] = "B" if "bytes" in phase else "s"
        ds.attrs["axes"] = "rank, repeat"
    for name in ("metrics", "accuracy"):
        g = group.create_group(name)
        for key, value in record[name].items():
            g.attrs[key] = value
    group["metrics"].attrs["units"] = json.dumps(record.get("units", {}))
    if output_parts:
        batch, tokens, *row = output_shape
        layout = h5py.VirtualLayout(shape=output_shape, dtype=np.dtype(precision(case.dtype).file_dtype))
        files = list(dict.fromkeys(output_parts))   # one shared file when written with parallel HDF5
        sources = [f.replace("%", "%%") for f in files]  # HDF5 reads % in source names as a format
        if len(files) == 1:
            layout[...] = h5py.VirtualSource(sources[0], "output", shape=output_shape)
        else:
            for r, part in enumerate(sources):
                layout[:, r * shard:(r + 1) * shard] = h5py.VirtualSource(part, "output",
                                                                           shape=(batch, shard, *row))
        ds = group.create_virtual_dataset("output", layout, fillvalue=np.nan)
        ds.attrs["order"] = "natural"
        ds.attrs["axes"] = "batch, token, head, dim"
        ds.attrs["parts"] = json.dumps(files)
        ds.attrs["part_sha256"] = json.dumps(list(part_digests or []))
    group.attrs["finished_utc"] = utc_now()
    group.attrs["complete"] = True


def _check_parts_are_ours(parts: Path) -> None:
    """Refuse to remove a ``.parts`` folder holding anything but case folders of output files."""
    if not parts.exists():
        return
    strange = [p for p in parts.rglob("*") if not (p.is_dir() and p.parent == parts)
               and not (p.is_file() and p.parent.parent == parts and p.suffix == ".h5")
               and not (p.is_file() and p == parts / OWNER_FILE)]
    if not parts.is_dir() or strange:
        example = str(strange[0]) if strange else str(parts)
        raise OutputError(f"{str(parts)!r} holds files that are not output parts (e.g. {example!r}); it is not "
                          f"removed: move it away first", "output")


def _plan_resume(src: h5py.File, path: Path, job: Job, inputs: dict[str, str]) -> tuple[list[str], list[str]]:
    """The complete, sound cases of ``src`` to keep, and notes on what runs again; OutputError if not this job.

    Refused (nothing changes on disk): a file of another program, of another job
    (name or content, naming the first difference), whose complete cases have
    other parameters than this run's (naming the parameter), or whose complete
    cases read an input file that has changed since (``inputs``: its SHA-256 now).
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
        if case is None:
            raise OutputError(f"{where}: it holds case {cid}, which this run of job {job.name!r} does not have "
                              f"(another rank count?); resume with the same job and ranks, or write to another "
                              f"file with -o", "output")
        theirs = json.loads(params) if isinstance(params, str) else {}
        ours = case.params()
        differ = [k for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]
        if differ:
            k = differ[0]
            raise OutputError(f"{where}: case {cid} has {k} = {theirs.get(k)!r} in the file, {ours.get(k)!r} in "
                              f"this run; resume only with the same job and ranks, or write to another file "
                              f"with -o", "output")
        _refuse_changed_input(group, case, inputs, where)
        problem = _case_problem(group, case, job, path, src.attrs.get("results_id"))
        if problem:
            notes.append(f"case {cid}: {problem}; it runs again")
            continue
        keep.append(cid)
    return keep, notes


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
    """Why a complete case cannot be trusted (missing data, an input or output that cannot be verified, missing
    or wrong output parts), or None."""
    try:
        for name in ("timings", "metrics", "accuracy"):
            if name not in group:
                return f"its {name} are missing"
        group["timings/attention"][()]
        if case.input and not group.attrs.get("input_sha256", ""):
            return "it recorded no checksum of its input file (an earlier version wrote it)"
        if not job.save_output:
            return None
        if "output" not in group:
            return "its output is missing"
        ds = group["output"]
        shape = (case.batch, case.tokens, case.heads, case.head_dim)
        stored = np.dtype(precision(case.dtype).file_dtype)
        if ds.shape != shape or ds.dtype != stored:
            return f"its output is {ds.shape} {ds.dtype}, expected {shape} {stored}"
        if not results_id or not json.loads(ds.attrs.get("part_sha256", "[]")):
            return "its output parts carry no checksum (an earlier version wrote them)"
        return output_problem(group, path, results_id)
    except READ_ERRORS as exc:
        return f"it is unreadable ({exc})"
