"""The kernels' geometry parameters (``DILATED_GEOMETRY_PARAMS`` in common.cuh) and their one Python packer
(``kernels.launch.GEOMETRY``, ``geometry_arguments``) agree name for name and type for type, read from the
header's text; every kernel parameter list but tma16's ends with them. No GPU, no compiler."""

from __future__ import annotations

import re

import numpy as np

from hilbert_hpc.kernels.launch import GEOMETRY, geometry_arguments
from hilbert_hpc.kernels.program import KERNEL_DIR

#: the NumPy type a kernel parameter of each C type is packed as
C_TYPES = {"long long": np.int64, "int": np.int32, "float": np.float32}


def macro(name: str) -> str:
    """The body of a ``#define`` of common.cuh, continuation lines joined."""
    text = (KERNEL_DIR / "common.cuh").read_text().replace("\\\n", " ")
    found = re.search(rf"^#define {re.escape(name)}\b(?:\([^)]*\))?(.*)$", text, re.M)
    assert found, f"common.cuh defines {name}"
    return found.group(1).strip()


def parameters(body: str) -> list[tuple[str, str]]:
    """(C type, name) of a comma-separated parameter list."""
    return [(m.group(1), m.group(2)) for m in (re.fullmatch(r"\s*(long long|int|float)\s+(\w+)\s*", p)
                                               for p in body.split(",")) if m]


def test_the_packer_is_the_kernels_geometry_name_for_name_and_type_for_type():
    declared = parameters(macro("DILATED_GEOMETRY_PARAMS"))
    assert len(declared) == len(macro("DILATED_GEOMETRY_PARAMS").split(","))     # every parameter a scalar
    assert [(name, C_TYPES[c]) for c, name in declared] == list(GEOMETRY)


def test_every_parameter_list_ends_with_the_geometry():
    for name in ("DILATED_FWD16_PARAMS", "DILATED_BWD_PARAMS"):
        assert macro(name).endswith("DILATED_GEOMETRY_PARAMS"), name
    assert macro("DILATED_FWD_PARAMS") == "DILATED_FWD16_PARAMS(float)"
    for source in sorted(KERNEL_DIR.glob("dilated_*.cu")):
        if source.name == "dilated_fwd_tma_16.cu":            # its own table of launch parts
            continue
        assert re.search(r"\((DILATED_FWD_PARAMS|DILATED_FWD16_PARAMS\(T\)|DILATED_BWD_PARAMS\(\w+\))[,)]",
                         source.read_text()), f"{source.name} takes the geometry"


def test_a_packer_out_of_step_with_the_header_is_caught():
    """The check can fail: the header's list with two parameters swapped is not the packer's."""
    declared = parameters(macro("DILATED_GEOMETRY_PARAMS"))
    i, j = [name for _, name in declared].index("mq"), [name for _, name in declared].index("mk")
    declared[i], declared[j] = declared[j], declared[i]
    assert [(name, C_TYPES[c]) for c, name in declared] != list(GEOMETRY)


def test_geometry_arguments_are_typed_as_the_kernels_take_them():
    """Strides int64, counts and the causal pair int32 (no shift: causal 0, shift 0), scale float32, in order."""
    args = geometry_arguments((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15, 16), 3, 100, 200, -7, 0.125)
    assert [type(a) for a in args] == [kind for _, kind in GEOMETRY]
    assert [a.item() for a in args] == [*range(1, 17), 3, 100, 200, 1, -7, 0.125]
    assert [a.item() for a in geometry_arguments(*[(0, 0, 0, 1)] * 4, 1, 2, 3, None, 1.0)][-3:] == [0, 0, 1.0]
