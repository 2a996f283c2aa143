"""The element-offset geometry every fused launch takes, and what is decided about it before any kernel.

A launch (the keyword arguments of a launcher: ``hilbert_hpc.kernels.launch``) runs ``segments x heads``
problems; each of its geometries ``qg``, ``kg``, ``vg``, ``lg`` (and ``og``) is (base, segment stride, head
stride, row stride) in elements (docs/kernels.md). Pure arithmetic on those tuples, for the ring and the
gather schedule as for the kernels.
"""

from __future__ import annotations

from typing import Sequence

#: the geometry fields of a launch (base, segment, head and row strides in elements)
GEOMETRIES = ("qg", "kg", "vg", "lg", "og")


def coalesce_heads(launches: Sequence[dict]) -> list[dict]:
    """``launches`` with each run of adjacent one-head, one-segment launches that differ only in their bases,
    by the same step from one to the next in every geometry, made one launch over that many heads (each
    geometry's head stride the step): the head offsets of a long pattern whose dilation is at least the head
    count (one head each: LongNet's global patterns), in one launch instead of one each, so that a ring hop or a
    gathered pattern is one launch of many blocks, not many launches of a few. Launches that write the same
    rows (a step of 0) stay apart."""
    def shared(kw: dict) -> tuple:
        return tuple((f, v if f not in GEOMETRIES or v is None else v[1:]) for f, v in sorted(kw.items())
                     if f != "heads")

    def step(a: dict, b: dict) -> tuple | None:
        steps = tuple(None if a.get(f) is None else b[f][0] - a[f][0] for f in GEOMETRIES)
        return None if any(x == 0 for x in steps) else steps

    runs: list[tuple[list[dict], tuple | None]] = []
    for kw in launches:
        single = kw["heads"] == 1 and kw["segments"] == 1
        if runs and single:
            group, steps = runs[-1]
            last = group[-1]
            if last["heads"] == 1 and last["segments"] == 1 and shared(last) == shared(kw):
                now = step(last, kw)
                if now is not None and (steps is None or now == steps):
                    group.append(kw)
                    runs[-1] = (group, now)
                    continue
        runs.append(([kw], None))
    out = []
    for group, steps in runs:
        if len(group) == 1:
            out.append(group[0])
            continue
        merged = dict(group[0], heads=len(group))
        for f, by in zip(GEOMETRIES, steps):
            if by is not None:
                g = merged[f]
                merged[f] = (g[0], g[1], by, g[3])
        out.append(merged)
    return out
