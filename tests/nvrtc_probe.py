"""Whether NVRTC can compile here (CuPy + libnvrtc, no GPU needed), for the kernel source tests.

CI sets ``HILBERT_HPC_REQUIRE_NVRTC=1`` (``REQUIRED``), so those tests cannot silently skip there.
"""

from __future__ import annotations

import os

import pytest

try:
    from cupy.cuda import nvrtc

    nvrtc.getVersion()
    HAVE_NVRTC = True
except Exception:  # noqa: BLE001 - CuPy or libnvrtc missing
    HAVE_NVRTC = False

REQUIRED = os.environ.get("HILBERT_HPC_REQUIRE_NVRTC") == "1"
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="needs cupy-cuda12x and nvidia-cuda-nvrtc-cu12")
