"""HDF5 results: provenance at the root, one group per case under ``/cases``.

Layout (docs/results.md)::

    /                     attrs: program, version, git_hash, command_line, job_text, job_path,
                                 started_utc, finished_utc, host, cpu, versions (JSON), gpus (JSON), ...
    /cases/<case-id>/     attrs: every case parameter, complete (bool), finished_utc
        timings/<name>    float64 (ranks, repeats): phases and ring counters in seconds, bytes_sent in B,
                          useful_flops (the rank's) in FLOP
        metrics           attrs: tokens_per_s, useful_tflops, ... (median over repeats)
        accuracy          attrs: rows, max_abs_err, max_rel_err, rel_l2_err (vs float64 reference)
        output            (B, N, H, Dv) in natural order, only when the job saves outputs: a virtual
                          dataset over the part files in ``<results file name>.parts/``, which carry
                          the results file's ``results_id`` and whose SHA-256 the case records
        grad_q, grad_k, grad_v  (B, N, H, D) likewise, for pass = forward+backward cases

The file under its final name is never modified in place: each change is
written to a copy under a temporary name and renamed over it (``ResultsFile``),
so a run stopped at any moment leaves a consistent file of complete cases.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from hilbert_hpc.core.precision import precision
from hilbert_hpc.study import record as rec
from hilbert_hpc.study.jobfile import Case, Job
from hilbert_hpc.study.output_files import (IO_ERRORS, OutputError, OutputLock, existing_output, io_error, make_parent,
                                            refuse_protected, replace_hdf5)
from hilbert_hpc.study.parts import (PARTS_SUFFIX, check_parts_are_ours, make_parts_dir, parts_dir,
                                     refuse_foreign_parts)
from hilbert_hpc.study.provenance import code_of, utc_now
from hilbert_hpc.study.results_read import READ_ERRORS, is_results_file
from hilbert_hpc.study.resume import input_digests, job_fingerprint, plan_resume


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


def new_results_id() -> str:
    """A random identity for a new results file, stored at its root and in each of its output parts."""
    return uuid.uuid4().hex


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
        #: the code of this run (``provenance.code_of``), recorded with each case it computes and in its
        #: ``resumes`` entry: a resume may run other code than the run that began the file
        self.code: dict[str, str] = {}
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
        results.code = code_of(provenance)
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
                check_parts_are_ours(parts)
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
            keep, notes = plan_resume(src, self.path, job, self.inputs, provenance.get("ranks"))

            def fill(h5: h5py.File) -> None:
                for key, value in src.attrs.items():
                    h5.attrs[key] = value
                h5.attrs["job_fingerprint"] = job_fingerprint(job.text)
                h5.attrs["results_id"] = self.results_id
                resumes = json.loads(src.attrs.get("resumes", "[]"))
                resumes.append({"started_utc": provenance.get("started_utc"),
                                "command_line": provenance.get("command_line"),
                                "ranks": provenance.get("ranks"), "hosts": provenance.get("hosts"),
                                "left_out": provenance.get("left_out", []), **self.code})
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

    def write_case(self, case: Case, record: rec.CaseRecord, output_parts: list[str] | None = None,
                   output_shape: tuple[int, ...] | None = None, shard: int | None = None,
                   part_digests: dict[str, list[str]] | None = None) -> None:
        """Store one case (parameters, timings, metrics, accuracy, optional output), marked complete.

        ``output_parts`` are the ranks' output files (paths relative to this file,
        rank order): one per rank, each holding ``shard`` natural-order tokens, or
        the same shared file from every rank (parallel HDF5). The case's ``output``
        is a virtual dataset over them, in natural order, and so is each gradient of
        a forward+backward case beside it; ``part_digests`` are, by dataset name
        (``record.SAVED``), the SHA-256 of each rank's block (:func:`block_digest`). The SHA-256 of the
        case's input file is recorded too. A failing write (a full disk) raises
        OutputError and leaves the file as it was. The first case starts the new
        file (:meth:`begin`).
        """
        self.begin()
        input_sha256 = self.inputs.get(str(case.input), "") if case.input else None
        self._replace(lambda h5: _write_case(h5, case, record, output_parts, output_shape, shard, part_digests,
                                             input_sha256, self.code),
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


def _write_case(h5: h5py.File, case: Case, record: rec.CaseRecord, output_parts: list[str] | None,
                output_shape: tuple[int, ...] | None, shard: int | None,
                part_digests: dict[str, list[str]] | None = None,
                input_sha256: str | None = None, code: dict[str, str] | None = None) -> None:
    """One case group (see :meth:`ResultsFile.write_case`), field by field of the record (``record.py``).

    The setup is written after the parameters: its ``transport`` (used) replaces the one requested.
    """
    group = h5["cases"].create_group(case.case_id)
    for key, value in [*case.params().items(), *rec.values(record.setup)]:
        group.attrs[key] = hdf5_attr(value)
    timings = group.create_group("timings")
    for f in dataclasses.fields(record.timings):
        ds = timings.create_dataset(f.name, data=np.asarray(getattr(record.timings, f.name), dtype=np.float64))
        ds.attrs["units"] = rec.unit(f)
        ds.attrs["axes"] = "rank, repeat"
    for name in ("metrics", "accuracy"):
        g = group.create_group(name)
        for key, value in rec.values(getattr(record, name)):
            g.attrs[key] = value
    group["metrics"].attrs["units"] = json.dumps(rec.units(type(record.metrics)))
    if output_parts:
        files = list(dict.fromkeys(output_parts))   # one shared file when written with parallel HDF5
        digests = part_digests or {"output": []}    # no digests: the output alone, unchecked
        for name in rec.SAVED:
            if name in digests:
                _saved_dataset(group, name, case, files, output_shape, shard, digests[name])
    code = code or {}
    kept = rec.Bookkeeping(params_json=params_json(case), input_sha256=input_sha256,
                           version=code.get("version", ""), git_hash=code.get("git_hash", ""),
                           finished_utc=utc_now(), complete=True)
    for key, value in rec.values(kept):
        if value is not None:                     # input_sha256: only cases with an input file
            group.attrs[key] = value


def _saved_dataset(group: h5py.Group, name: str, case: Case, files: list[str], shape: tuple[int, ...],
                   shard: int | None, digests: list[str]) -> None:
    """The case's dataset ``name`` (``record.SAVED``): a virtual dataset, in natural order, over the dataset of
    that name in the part files, with the attributes of ``record.Output``."""
    batch, tokens, *row = shape
    layout = h5py.VirtualLayout(shape=shape, dtype=np.dtype(precision(case.dtype).file_dtype))
    sources = [f.replace("%", "%%") for f in files]  # HDF5 reads % in source names as a format
    if len(files) == 1:
        layout[...] = h5py.VirtualSource(sources[0], name, shape=shape)
    else:
        for r, part in enumerate(sources):
            layout[:, r * shard:(r + 1) * shard] = h5py.VirtualSource(part, name, shape=(batch, shard, *row))
    ds = group.create_virtual_dataset(name, layout, fillvalue=np.nan)
    output = rec.Output(order="natural", axes="batch, token, head, dim", parts=json.dumps(files),
                        part_sha256=json.dumps(list(digests)))
    for key, value in rec.values(output):
        ds.attrs[key] = value
