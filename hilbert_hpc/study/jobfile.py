"""Job files: TOML study descriptions, validated strictly, expanded into cases.

Format (see docs/jobs.md)::

    [job]                 # run-wide settings
    name = "quickstart"
    output = "results/quickstart.h5"
    seed = 2026
    repeats = 3
    warmup = 1
    accuracy_rows = 32
    save_output = false

    [defaults]            # case parameters shared by every case
    heads = 4

    [[cases]]             # one or more case tables; scalar keys are fixed ...
    name = "grid2d"
    grid = [64, 64]
    patterns = [[256, 1], [1024, 4]]
    [cases.sweep]         # ... and keys under sweep take each listed value (Cartesian product)
    ordering = ["natural", "hilbert"]

Every problem is reported as a ``JobFileError`` naming the parameter
(``cases[0].sweep.ordering[1]``), before any work is done.
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hilbert_hpc.errors import ConfigError, JobFileError
from hilbert_hpc.core.ordering import ORDERINGS, resolve_ordering
from hilbert_hpc.distributed.schedule import SCHEDULES
from hilbert_hpc.core.work import PLACEMENTS
from hilbert_hpc.distributed.transports import TRANSPORTS
from hilbert_hpc.core.patterns import Pattern, check_problem, check_serializable, parse_grid, parse_patterns
from hilbert_hpc.backends import PASSES, check_backend, check_pass
from hilbert_hpc.core.precision import DTYPES

#: longest job, case or study name (names become file names and HDF5 group names)
MAX_NAME = 64
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.-]")
#: strong: the same problem on every rank count; weak: tokens (grid axis 0) grow with the rank count
SCALINGS = ("strong", "weak")


def _int(lo: int = 1) -> Callable[[Any, str], int]:
    def check(value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise JobFileError(f"expected an integer, got {value!r}", where)
        if value < lo:
            raise JobFileError(f"must be at least {lo}, got {value}", where)
        return value
    return check


def check_job_seed(value: Any, where: str) -> int:
    """A seed of the random inputs: an integer from 0 to 2**62 - 1 (larger ones would repeat smaller ones')."""
    from hilbert_hpc.core.inputs import check_seed

    _int(0)(value, where)
    try:
        return check_seed(value)
    except ValueError as exc:
        raise JobFileError(str(exc).replace("seed must be", "must be"), where) from None


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise JobFileError(f"expected true or false, got {value!r}", where)
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise JobFileError(f"expected a non-empty string, got {value!r}", where)
    return value


def check_name(value: Any, where: str) -> str:
    """A job, case or study name: 1 to 64 ASCII letters, digits, '-', '_' or '.', not starting with '.' or '-',
    without '..'; names become file names and HDF5 groups, so a '/' or '..' would escape the results folder.
    """
    if not isinstance(value, str):
        raise JobFileError(f"expected a name (a string), got {value!r}", where)
    if not value:
        raise JobFileError("the name is empty: give 1 to 64 letters, digits, '-', '_' or '.'", where)
    if len(value) > MAX_NAME:
        raise JobFileError(f"the name {value!r} has {len(value)} characters, at most {MAX_NAME} are allowed: "
                           f"shorten it", where)
    bad = next((ch for ch in value if not _NAME_CHARS.fullmatch(ch)), None)
    if bad is not None:
        raise JobFileError(f"the name {value!r} contains {bad!r}: use only letters, digits, '-', '_' and '.'",
                           where)
    if value[0] in ".-":
        raise JobFileError(f"the name {value!r} starts with {value[0]!r}: start it with a letter, digit or '_'",
                           where)
    if ".." in value:
        raise JobFileError(f"the name {value!r} contains '..': use single dots only", where)
    return value


def _choice(options: tuple[str, ...]) -> Callable[[Any, str], str]:
    def check(value: Any, where: str) -> str:
        if value not in options:
            raise JobFileError(f"expected one of {', '.join(options)}, got {value!r}", where)
        return value
    return check


def _scale(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise JobFileError(f"expected a positive number, got {value!r}", where)
    return float(value)


def _grid(value: Any, where: str) -> tuple[int, ...]:
    try:
        return parse_grid(value, None, where)
    except ConfigError as exc:
        raise JobFileError(exc.message, where) from None


def _length_term(value: Any, where: str) -> int | str:
    """A pattern entry: a positive integer, or "N" / "N/k" (the sequence length, divided by k)."""
    if isinstance(value, str):
        text = value.replace(" ", "")
        if text == "N" or (text.startswith("N/") and text[2:].isdigit() and int(text[2:]) > 0):
            return text
        raise JobFileError(f"expected a positive integer, \"N\" or \"N/k\", got {value!r}", where)
    return value


def _patterns(value: Any, where: str) -> tuple:
    """Patterns as given: [segment, dilation] pairs whose entries may be "N" or "N/k" (resolved per case)."""
    if not isinstance(value, list):
        raise JobFileError(f"expected a list of [segment, dilation] pairs, got {value!r}", where)
    specs = []
    for i, item in enumerate(value):
        if not isinstance(item, list) or len(item) != 2:
            raise JobFileError(f"expected a [segment, dilation] pair, got {item!r}", f"{where}[{i}]")
        specs.append(tuple(_length_term(x, f"{where}[{i}]") for x in item))
    if all(isinstance(x, int) for pair in specs for x in pair):
        resolve_patterns(tuple(specs), 0, where)            # validate now when nothing depends on N
    elif not specs:
        resolve_patterns((), 0, where)
    return tuple(specs)


def resolve_patterns(specs: tuple, tokens: int, where: str) -> tuple[Pattern, ...]:
    """Patterns at sequence length ``tokens`` ("N" -> tokens, "N/k" -> tokens // k, which k must divide)."""
    pairs = []
    for i, pair in enumerate(specs):
        values = []
        for x in pair:
            if isinstance(x, str):
                k = 1 if x == "N" else int(x[2:])
                if tokens % k:
                    raise JobFileError(f"{x} needs the sequence length {tokens} to be divisible by {k}",
                                       f"{where}[{i}]")
                x = tokens // k
            values.append(x)
        pairs.append(values)
    try:
        return parse_patterns(pairs, where)
    except ConfigError as exc:
        raise JobFileError(exc.message, exc.param) from None


def _ranks(value: Any, where: str) -> int | str:
    """Ranks of a case: a positive integer, "all" (every rank of the run) or "pow2" (1, 2, 4 ... all)."""
    if value in ("all", "pow2"):
        return value
    return _int(1)(value, where)


def _backend(value: Any, where: str) -> str:
    from hilbert_hpc.backends import BACKENDS

    return _choice(tuple(BACKENDS))(value, where)


def _backends(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise JobFileError(f"expected a list of backend names, got {value!r}", where)
    return tuple(_backend(v, f"{where}[{i}]") for i, v in enumerate(value))


#: rows compared with float64 when a job does not say (``[job] accuracy_rows``)
DEFAULT_ACCURACY_ROWS = 32
#: Job-wide settings: key -> (validator, default)
JOB_KEYS: dict[str, tuple[Callable[[Any, str], Any], Any]] = {
    "name": (check_name, "job"),
    "output": (_str, None),
    "seed": (check_job_seed, 2026),
    "repeats": (_int(1), 3),
    "warmup": (_int(0), 1),
    "accuracy_rows": (_int(0), DEFAULT_ACCURACY_ROWS),
    "save_output": (_bool, False),
    "interleave": (_bool, False),
    "optional_backends": (_backends, ()),
}

#: the job key ``placement``: "auto" decides per case and rank count (``setup.case_placement``)
PLACEMENT_CHOICES = ("auto", *PLACEMENTS)

#: Case parameters: key -> validator; ``grid`` or ``tokens`` is required. A key a case leaves out takes the
#: default of the :class:`Case` field of its name (``CASE_FIELDS``; ``ranks``: "all", every rank of the run).
CASE_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "grid": _grid,
    "tokens": _int(1),
    "patterns": _patterns,
    "batch": _int(1),
    "heads": _int(1),
    "head_dim": _int(1),
    "causal": _bool,
    "ordering": _choice(ORDERINGS),
    "segment": _int(1),
    "dtype": _choice(DTYPES),
    "backend": _backend,
    "scale": _scale,
    "transport": _choice(TRANSPORTS),
    "input": _str,
    "ranks": _ranks,
    "scaling": _choice(SCALINGS),
    "pass": _choice(PASSES),
    "placement": _choice(PLACEMENT_CHOICES),
    "long_schedule": _choice(SCHEDULES),
}
#: the Case field of a key whose name is a Python keyword
CASE_FIELDS = {"pass": "pass_"}


@dataclass(frozen=True)
class Case:
    """One fully resolved problem to run and time."""

    case_id: str
    name: str
    grid: tuple[int, ...]
    patterns: tuple[Pattern, ...]
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    causal: bool = False
    ordering: str = "natural"
    segment: int | None = None
    dtype: str = "float32"
    backend: str = "numpy"
    scale: float | None = None
    transport: str = "auto"
    input: str | None = None
    ranks: int = 1
    scaling: str = "strong"
    #: the job key ``pass``: "forward", or "forward+backward" (the backward timed after the forward)
    pass_: str = "forward"
    #: which serialized positions each rank holds: "auto", "contiguous" or "zigzag" (``setup.case_placement``)
    placement: str = "auto"
    #: how long patterns move their K/V rows: "auto", "gather" or "ring" (``distributed.schedule``)
    long_schedule: str = "auto"

    @property
    def tokens(self) -> int:
        """Sequence length N = prod(grid)."""
        return math.prod(self.grid)

    @property
    def softmax_scale(self) -> float:
        """The scale applied to QK^T (1/sqrt(D) unless set)."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    def params(self) -> dict[str, Any]:
        """Every parameter as plain values (for HDF5 attributes and matching): ``record.Parameters``."""
        from hilbert_hpc.study.record import Parameters, values

        return dict(values(Parameters.of(self)))


@dataclass(frozen=True)
class Job:
    """A validated job: run-wide settings plus the expanded list of cases."""

    name: str
    output: str
    seed: int
    repeats: int
    warmup: int
    accuracy_rows: int
    save_output: bool
    cases: tuple[Case, ...]
    text: str = ""
    path: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    #: run call r of every case on the same rank count before call r+1 of any (runner.run_interleaved)
    interleave: bool = False
    #: backends whose cases ``run`` leaves out where they cannot run (``setup.runnable_here``)
    optional_backends: tuple[str, ...] = ()

    def with_transport(self, transport: str) -> "Job":
        """The same job with every case's transport overridden (command-line ``--transport``)."""
        import dataclasses

        cases = tuple(dataclasses.replace(c, transport=transport) for c in self.cases)
        return dataclasses.replace(self, cases=cases, settings={**self.settings, "transport_override": transport})


def _check_table(table: Any, where: str) -> dict:
    if not isinstance(table, dict):
        raise JobFileError(f"expected a table, got {table!r}", where)
    return table


def _unknown(table: dict, allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            near = ", ".join(sorted(allowed))
            raise JobFileError(f"unknown key {key!r} (allowed: {near})", f"{where}.{key}" if where else key)


def _apply_input(values: dict[str, Any], where: str) -> None:
    """Take tokens, grid, batch, heads and head_dim from an input file; refuse contradictions."""
    from hilbert_hpc.distributed.datafile import describe_input

    try:
        info = describe_input(values["input"], f"{where}.input")
    except ConfigError as exc:
        raise JobFileError(exc.message, exc.param) from None
    if info["v_dim"] != info["head_dim"]:
        raise JobFileError("input files need v with the head dimension of q and k", f"{where}.input")
    if values.get("grid") is None and values.get("tokens") is None:
        values["grid"] = info["grid"] or (info["tokens"],)
    for key in ("batch", "heads", "head_dim"):
        given = values.get(key)
        if given is not None and given != info[key]:
            raise JobFileError(f"{key} = {given} contradicts the input file ({info[key]})", f"{where}.{key}")
        values[key] = info[key]
    n = math.prod(values["grid"]) if values.get("grid") is not None else values["tokens"]
    if n != info["tokens"]:
        raise JobFileError(f"the case has {n} tokens, the input file {info['tokens']}", f"{where}.input")


def _resolve_case(values: dict[str, Any], where: str, case_id: str, name: str) -> Case:
    """Validate one combination of case parameters, including cross-parameter rules."""
    if values.get("input") is not None:
        values = dict(values)
        _apply_input(values, where)
    grid = values.get("grid")
    tokens = values.get("tokens")
    if grid is None and tokens is None:
        raise JobFileError("give either 'grid' (token grid) or 'tokens' (1-D length)", where)
    if grid is not None and tokens is not None and math.prod(grid) != tokens:
        raise JobFileError(f"grid product {math.prod(grid)} does not equal tokens = {tokens}", f"{where}.grid")
    grid = grid if grid is not None else (tokens,)
    if values.get("scaling") == "weak":
        if values.get("input") is not None:
            raise JobFileError("weak scaling makes the sequence longer with the rank count; it cannot use an "
                               "input file", f"{where}.scaling")
        grid = (grid[0] * values["ranks"], *grid[1:])      # the given grid is the problem of one rank
    if values.get("patterns") is None:
        raise JobFileError("'patterns' is required: a list of [segment, dilation] pairs", where)
    patterns = resolve_patterns(values["patterns"], math.prod(grid), f"{where}.patterns")
    try:
        check_problem(math.prod(grid), patterns, f"{where}.patterns")
    except ConfigError as exc:
        raise JobFileError(exc.message, exc.param) from None
    try:
        ordering, segment = resolve_ordering(values.get("ordering", "natural"), patterns, values.get("segment"),
                                             math.prod(grid))
        check_serializable(tuple(grid), ordering, segment, f"{where}.grid", f"{where}.segment")
        check_backend(values.get("dtype", "float32"), values.get("backend", "numpy"), f"{where}.dtype")
        check_pass(values.get("pass", "forward"), values.get("backend", "numpy"), f"{where}.pass")
    except ConfigError as exc:
        raise JobFileError(exc.message, exc.param if "." in exc.param else f"{where}.{exc.param}") from None
    kwargs = {CASE_FIELDS.get(k, k): v for k, v in values.items()
              if k not in ("grid", "tokens", "patterns", "segment")}
    return Case(case_id=case_id, name=name, grid=tuple(grid), patterns=patterns, segment=segment, **kwargs)


def _rank_counts(value: int | str, world_size: int | None, where: str) -> list[int]:
    """The rank counts a case runs on; ``world_size`` None: not known (validation only, as one rank)."""
    size = world_size or 1
    if value == "all":
        return [size]
    if value == "pow2":
        return [1 << i for i in range(size.bit_length()) if (1 << i) <= size]
    if world_size is not None and value > world_size:
        raise JobFileError(f"the case needs {value} ranks, this run has {world_size}", where)
    return [value]


def expand_cases(raw_cases: Any, defaults: dict[str, Any], world_size: int | None = None) -> list[Case]:
    """Expand the ``[[cases]]`` tables (with their sweeps and rank counts) into validated Cases.

    ``world_size`` (the ranks of the run) resolves ``ranks = "all"`` / ``"pow2"``
    and refuses cases needing more ranks than the run has.
    """
    if not isinstance(raw_cases, list) or not raw_cases:
        raise JobFileError("at least one [[cases]] table is required", "cases")
    cases: list[Case] = []
    for ci, raw in enumerate(raw_cases):
        where = f"cases[{ci}]"
        raw = dict(_check_table(raw, where))
        name = check_name(raw.pop("name", f"case{ci}"), f"{where}.name")
        sweep = _check_table(raw.pop("sweep", {}), f"{where}.sweep")
        _unknown(raw, set(CASE_KEYS), where)
        _unknown(sweep, set(CASE_KEYS), f"{where}.sweep")
        fixed = dict(defaults)
        for key, value in raw.items():
            fixed[key] = CASE_KEYS[key](value, f"{where}.{key}")
        axes = []
        for key, values in sweep.items():
            if not isinstance(values, list) or not values:
                raise JobFileError(f"a sweep takes a non-empty list of values, got {values!r}",
                                   f"{where}.sweep.{key}")
            axes.append([(key, CASE_KEYS[key](v, f"{where}.sweep.{key}[{i}]")) for i, v in enumerate(values)])
        for combo in itertools.product(*axes) if axes else [()]:
            values = dict(fixed)
            values.update(combo)
            where_ranks = f"{where}.sweep.ranks" if "ranks" in sweep else f"{where}.ranks"
            for p in _rank_counts(values.get("ranks", "all"), world_size, where_ranks):
                case_id = f"{len(cases):04d}-{name}"
                cases.append(_resolve_case({**values, "ranks": p}, where, case_id, name))
    return cases


#: the most bytes read of a job or study file (a TOML text of a few KiB; /dev/zero or a data file is refused)
MAX_JOB_BYTES = 16 << 20


def read_text_capped(path: str | Path) -> str:
    """The UTF-8 text of a job or study file, reading at most ``MAX_JOB_BYTES`` (+1 to notice more)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_JOB_BYTES + 1)
    except OSError as exc:
        raise JobFileError(f"cannot read job file: {exc.strerror or exc}", str(path)) from None
    if len(data) > MAX_JOB_BYTES:
        raise JobFileError(f"larger than {MAX_JOB_BYTES >> 20} MiB, not a job file: a job file is TOML text of a few "
                           f"KiB", str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobFileError(f"not a UTF-8 text file (byte {exc.start} is {exc.object[exc.start:exc.start + 1]!r}); "
                           f"a job file is TOML text", str(path)) from None


def read_toml(path: str | Path, text: str | None = None) -> tuple[dict, str]:
    """The parsed document and text of a TOML study file; JobFileError if unreadable, too large or not TOML."""
    if text is None:
        text = read_text_capped(path)
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        raise JobFileError(f"not valid TOML: {exc}", str(path)) from None


def load_job(path: str | Path, text: str | None = None, world_size: int | None = None) -> Job:
    """Read, validate and expand a job file for a run on ``world_size`` ranks; JobFileError names the problem."""
    path = Path(path)
    doc, text = read_toml(path, text)
    _unknown(doc, {"job", "defaults", "cases"}, "")
    job_table = dict(_check_table(doc.get("job", {}), "job"))
    _unknown(job_table, set(JOB_KEYS), "job")
    settings = {key: (check(job_table[key], f"job.{key}") if key in job_table else default)
                for key, (check, default) in JOB_KEYS.items()}
    defaults_table = _check_table(doc.get("defaults", {}), "defaults")
    _unknown(defaults_table, set(CASE_KEYS), "defaults")
    defaults = {key: CASE_KEYS[key](value, f"defaults.{key}") for key, value in defaults_table.items()}
    cases = expand_cases(doc.get("cases"), defaults, world_size)
    output = settings["output"] or f"results/{settings['name']}.h5"
    return Job(name=settings["name"], output=output, seed=settings["seed"], repeats=settings["repeats"],
               warmup=settings["warmup"], accuracy_rows=settings["accuracy_rows"],
               save_output=settings["save_output"], cases=tuple(cases), text=text, path=str(path),
               settings=settings, interleave=settings["interleave"], optional_backends=settings["optional_backends"])


def accuracy_rows_notes(job: Job) -> list[str]:
    """One note per case name whose cases have fewer selected rows than ``accuracy_rows`` (all of them are checked).

    The accuracy check samples ``min(accuracy_rows, S)`` of the ``S`` rows the
    patterns select (``S`` = tokens when a dilation is at most the head count);
    these notes state the clamping instead of leaving it silent.
    """
    from hilbert_hpc.core.reference import selected_row_count

    rows = job.accuracy_rows
    notes = []
    for name in dict.fromkeys(c.name for c in job.cases):
        short = [(c, n) for c in job.cases if c.name == name
                 for n in (selected_row_count(c.tokens, c.heads, c.patterns, rows),) if n < rows]
        if not short:
            continue
        dense = all(n == c.tokens for c, n in short)
        what, checked = ("tokens", "rows") if dense else ("rows selected by the patterns", "selected rows")
        if len(short) == 1:
            c, n = short[0]
            notes.append(f"case {c.case_id} has {n} {what}, fewer than accuracy_rows = {rows}: "
                         f"all {n} {checked} are checked")
            continue
        sizes = sorted({n for _, n in short})
        counts = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}"
        notes.append(f"cases {short[0][0].case_id} ... {short[-1][0].case_id} ({len(short)} cases named {name}) "
                     f"have {counts} {what}, fewer than accuracy_rows = {rows}: all of their {checked} are checked")
    return notes
