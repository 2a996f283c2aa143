"""The one NVRTC entry (hilbert_hpc.kernels.compile): memory and disk cache, keys, torn entries, the cache
folder and its off switch, concurrent ranks; and that every compile site of the package goes through it.

NVRTC 12 compiles on the CPU (no GPU needed); without it these tests skip, unless HILBERT_HPC_REQUIRE_NVRTC=1.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
from pathlib import Path

import pytest

from hilbert_hpc import kernels
from hilbert_hpc.kernels import compile as kc
from hilbert_hpc.kernels import program
from hilbert_hpc.kernels.registry import TF32X3, TILED64, WGMMA

from nvrtc_probe import HAVE_NVRTC, REQUIRED, needs_nvrtc

PACKAGE = Path(kernels.__file__).resolve().parent.parent
#: a small program with a template, compiled in well under a second
TEXT = """
template <int N> __global__ void scale(float* x) { x[threadIdx.x] *= N; }
"""
NAMES = ("scale<3>",)
OPTIONS = ("-std=c++14", "-ftz=true")


def test_nvrtc_present_where_required():
    """CI sets HILBERT_HPC_REQUIRE_NVRTC=1, so the tests below cannot silently skip there."""
    assert HAVE_NVRTC or not REQUIRED


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder (HILBERT_HPC_CACHE_DIR), an empty memory cache, and a count of NVRTC compiles."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(kc.CACHE_ENV, str(folder))
    kc.clear_memory_cache()
    calls = []
    real = kc._run_nvrtc

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(kc, "_run_nvrtc", counted)
    yield folder, calls
    kc.clear_memory_cache()


def entries(folder: Path) -> list[Path]:
    return sorted((folder / kc.KERNEL_FOLDER).iterdir()) if (folder / kc.KERNEL_FOLDER).exists() else []


def compile_small(target: str = "sm_80", options=OPTIONS, text: str = TEXT) -> kc.Compiled:
    return kc.nvrtc_compile(text, "small.cu", NAMES, options, target)


@needs_nvrtc
def test_miss_then_memory_hit_then_disk_hit(cache):
    folder, calls = cache
    first = compile_small()
    assert len(calls) == 1 and first.binary[:4] == b"\x7fELF" and first.lowered["scale<3>"].startswith("_Z")
    assert [p.suffix for p in entries(folder)] == [".bin"]
    assert compile_small() is first and len(calls) == 1            # memory
    kc.clear_memory_cache()
    again = compile_small()                                        # disk: no second NVRTC compile
    assert len(calls) == 1
    assert (again.binary, again.lowered, again.log) == (first.binary, first.lowered, first.log)


@needs_nvrtc
def test_ptx_output_and_compile_errors(cache):
    ptx = kc.nvrtc_compile(TEXT, "small.cu", NAMES, OPTIONS, "compute_61", "ptx").binary
    assert b".target sm_61" in ptx
    with pytest.raises(RuntimeError, match=r"bad\.cu for sm_80: .*NVRTC_ERROR_COMPILATION"):
        kc.nvrtc_compile("__global__ void f() { undefined_name; }", "bad.cu", (), OPTIONS, "sm_80")
    with pytest.raises(ValueError, match="output"):
        kc.nvrtc_compile(TEXT, "small.cu", NAMES, OPTIONS, "sm_80", "fatbin")


@needs_nvrtc
def test_key_follows_options_target_names_and_text(cache):
    base = kc.cache_key(TEXT, "small.cu", NAMES, OPTIONS, "sm_80")
    assert kc.cache_key(TEXT, "small.cu", NAMES, OPTIONS, "sm_80") == base
    others = [kc.cache_key(TEXT, "small.cu", NAMES, (*OPTIONS, "--use_fast_math"), "sm_80"),
              kc.cache_key(TEXT, "small.cu", NAMES, OPTIONS, "sm_90"),
              kc.cache_key(TEXT, "small.cu", NAMES, OPTIONS, "sm_80", "ptx"),
              kc.cache_key(TEXT, "small.cu", ("scale<4>",), OPTIONS, "sm_80"),
              kc.cache_key(TEXT + " ", "small.cu", NAMES, OPTIONS, "sm_80")]
    assert len({base, *others}) == 6
    folder, calls = cache
    compile_small()
    compile_small(options=(*OPTIONS, "-lineinfo"))
    compile_small(target="sm_90")
    assert len(calls) == 3 and len(entries(folder)) == 3


@needs_nvrtc
def test_key_follows_the_text_of_an_included_header(tmp_path, monkeypatch):
    """program.source inlines the headers, so editing one (common.cuh) changes the key of every program
    that includes it, and of no other."""
    copy = tmp_path / "kernels"
    shutil.copytree(program.KERNEL_DIR, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(program, "KERNEL_DIR", copy)
    v = TF32X3.variant(64)

    def key(source: str) -> str:
        p = program.Program(source, (v.name,) if source == v.source else ())
        return kc.cache_key(program.source(p.source), p.source, p.names, p.options, "sm_80")

    before, keys_before = key(v.source), key("hilbert_keys.cu")
    header = copy / "common.cuh"
    header.write_text(header.read_text() + "\n// edited\n")
    assert key(v.source) != before
    assert key("hilbert_keys.cu") == keys_before                      # includes no header


@needs_nvrtc
@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "other_key"])
def test_a_damaged_entry_is_recompiled_not_trusted(cache, damage):
    folder, calls = cache
    good = compile_small()
    (entry,) = entries(folder)
    data = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(data[:len(data) // 2])
    elif damage == "flip":
        entry.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "garbage":
        entry.write_bytes(b"\x00" * 64)
    else:                                   # a valid entry of another program stored under this key
        kc.clear_memory_cache()
        other = kc._encode("0" * 64, kc.Compiled(b"\x7fELF not this one", {"scale<3>": "x"}, ""))
        entry.write_bytes(other)
    kc.clear_memory_cache()
    again = compile_small()
    assert len(calls) == 2 and again.binary == good.binary
    assert entry.read_bytes() == data                                 # replaced by a valid entry
    kc.clear_memory_cache()
    compile_small()
    assert len(calls) == 2


@needs_nvrtc
def test_cache_folder_override_default_and_off(tmp_path, monkeypatch, cache):
    _, calls = cache
    monkeypatch.delenv(kc.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kc.cache_dir() == tmp_path / "xdg" / "hilbert_hpc"
    compile_small()
    assert len(entries(tmp_path / "xdg" / "hilbert_hpc")) == 1
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kc.cache_dir() == tmp_path / "home" / ".cache" / "hilbert_hpc"
    monkeypatch.setenv(kc.CACHE_ENV, str(tmp_path / "mine"))
    assert kc.cache_dir() == tmp_path / "mine"
    for off in ("off", "OFF", " Off "):
        monkeypatch.setenv(kc.CACHE_ENV, off)
        assert kc.cache_dir() is None
    kc.clear_memory_cache()
    compile_small(target="sm_86")
    kc.clear_memory_cache()
    compile_small(target="sm_86")                                     # off: nothing on disk to hit
    assert len(calls) == 3
    assert not (tmp_path / "home").exists() and not Path("off").exists()


@needs_nvrtc
def test_an_unwritable_cache_folder_costs_only_the_cache(tmp_path, monkeypatch, cache):
    _, calls = cache
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(kc.CACHE_ENV, str(blocker))                   # kernels/ cannot be made inside a file
    assert compile_small().binary[:4] == b"\x7fELF"
    assert blocker.read_text() == "not a folder" and len(calls) == 1


def _compile_in_child(folder: str, barrier, results) -> None:
    os.environ[kc.CACHE_ENV] = folder
    barrier.wait()
    results.put(compile_small().binary)


@needs_nvrtc
def test_concurrent_ranks_share_one_entry(tmp_path):
    """Four processes start together on a cold cache (as the ranks of a node do): all get the same bytes, and
    the folder holds exactly one entry and no temporary file."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    folder = tmp_path / "cache"
    procs = [ctx.Process(target=_compile_in_child, args=(str(folder), barrier, results)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(set(got)) == 1 and got[0][:4] == b"\x7fELF"
    files = sorted(os.listdir(folder / kc.KERNEL_FOLDER))
    assert len(files) == 1 and files[0].endswith(".bin"), files


@needs_nvrtc
def test_programs_of_the_package_build_through_the_entry(cache):
    """A variant, the conversions and the key kernel compile for a device target (sm_XY), the sm_90a variants
    for their own; the lowered names are the ones the loader looks up."""
    from hilbert_hpc.tools import gpu_ordering
    from hilbert_hpc.kernels import sixteen_bit

    folder, calls = cache
    v = TILED64.variant(32)
    binary, lowered, _ = program.compile_cubin(v, cc=86)
    assert binary[:4] == b"\x7fELF" and lowered.startswith("_Z")
    assert program.target_of(v, 86) == "sm_86" and program.target_of(WGMMA.variant(32), 86) == "sm_90a"
    assert kc.device_target(90) == "sm_90" and kc.device_target(10_000).startswith("sm_")
    conv = program.build(sixteen_bit.CONVERT_PROGRAM, "sm_90")
    assert set(conv.lowered) == set(sixteen_bit.convert_names())
    assert program.build(gpu_ordering.KEYS_PROGRAM, "sm_70").lowered == {}
    with pytest.raises(ValueError, match="compute capability"):
        program.compile_cubin(v)
    assert len(calls) == 3 and len(entries(folder)) == 3


def test_nvrtc_and_rawmodule_only_in_the_compile_entry():
    """One compile path: no other module of the package creates an NVRTC program or a CuPy RawModule."""
    pattern = re.compile(r"createProgram|RawModule\(|RawKernel\(|compile_with_cache")
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if p.name != "compile.py" and pattern.search(p.read_text())]
    assert offenders == []


def test_fp32_kernel_is_gone():
    assert not hasattr(kernels, "fp32_kernel")
