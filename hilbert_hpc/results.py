"""HDF5 results: provenance at the root, one group per case under ``/cases``.

Layout (docs/results.md)::

    /                     attrs: program, version, git_hash, command_line, job_text, job_path,
                                 started_utc, finished_utc, host, cpu, versions (JSON), gpus (JSON), ...
    /cases/<case-id>/     attrs: every case parameter, complete (bool), finished_utc
        timings/<name>    float64 (ranks, repeats): phases and ring counters in seconds, bytes_sent in B
        metrics           attrs: tokens_per_s, useful_tflops, ... (median over repeats)
        accuracy          attrs: rows, max_abs_err, max_rel_err, rel_l2_err (vs float64 reference)
        output            (B, N, H, Dv) in natural order, only when the job saves outputs

A case's ``complete`` attribute is set only after its data have been flushed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .jobfile import Case, Job
from .errors import UserError
from .provenance import utc_now


def _attr(value: Any) -> Any:
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


class ResultsFile:
    """Writer for one results file (used by the rank that owns the file)."""

    def __init__(self, path: str | Path, job: Job, provenance: dict[str, Any], resume: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            self._reopen(provenance)
            return
        self.h5 = h5py.File(self.path, "w")
        for key, value in provenance.items():
            self.h5.attrs[key] = _attr(value)
        self.h5.attrs["job_name"] = job.name
        self.h5.attrs["job_path"] = job.path
        self.h5.attrs["job_text"] = job.text
        self.h5.attrs["job_settings"] = json.dumps(job.settings)
        self.h5.attrs["resumes"] = "[]"
        self.h5.create_group("cases")
        self.h5.flush()

    def _reopen(self, provenance: dict[str, Any]) -> None:
        """Open an earlier run's file to continue it: drop unfinished cases, record the restart."""
        try:
            self.h5 = h5py.File(self.path, "a")
        except OSError as exc:
            raise UserError(f"cannot resume {str(self.path)!r}: not a readable HDF5 file ({exc})", "output") from None
        if self.h5.attrs.get("program") != "hilbert-hpc" or "cases" not in self.h5:
            self.h5.close()
            raise UserError(f"cannot resume {str(self.path)!r}: not a hilbert-hpc results file", "output")
        for cid in list(self.h5["cases"]):
            if not self.h5["cases"][cid].attrs.get("complete", False):
                del self.h5["cases"][cid]
        resumes = json.loads(self.h5.attrs.get("resumes", "[]"))
        resumes.append({"started_utc": provenance.get("started_utc"), "command_line": provenance.get("command_line"),
                        "ranks": provenance.get("ranks"), "hosts": provenance.get("hosts")})
        self.h5.attrs["resumes"] = json.dumps(resumes)
        self.h5.flush()

    def completed(self, case: Case) -> bool:
        """True when the file holds this case, complete, with the same parameters; an error if they differ."""
        group = self.h5["cases"].get(case.case_id)
        if group is None:
            return False
        if group.attrs.get("params_json") != params_json(case):
            raise UserError(f"the results file holds case {case.case_id} with other parameters; "
                            f"resume only with the same job, or write to a new file", "output")
        return True

    def write_case(self, case: Case, record: dict[str, Any], output_parts: list[str] | None = None,
                   output_shape: tuple[int, ...] | None = None, shard: int | None = None) -> None:
        """Store one case (parameters, timings, metrics, accuracy, optional output), then mark it complete.

        ``output_parts`` are the ranks' output files (paths relative to this file,
        rank order): one per rank, each holding ``shard`` natural-order tokens, or
        the same shared file from every rank (parallel HDF5). The case's ``output``
        is a virtual dataset over them, in natural order.
        """
        group = self.h5["cases"].create_group(case.case_id)
        group.attrs["params_json"] = params_json(case)
        for key, value in case.params().items():
            group.attrs[key] = _attr(value)
        for key, value in record.get("attrs", {}).items():
            group.attrs[key] = _attr(value)
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
            layout = h5py.VirtualLayout(shape=output_shape, dtype=np.dtype(case.dtype))
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
        self.h5.flush()
        group.attrs["finished_utc"] = utc_now()
        group.attrs["complete"] = True
        self.h5.flush()

    def close(self) -> None:
        """Record the finish time and close the file."""
        if self.h5.id.valid:
            self.h5.attrs["finished_utc"] = utc_now()
            self.h5.close()
