"""Real Triton compiles for gfx908 on the CPU (marked triton; CI runs these: a handful of small
kernels, well under a minute). The kernels are written here (not AOTriton's): a tile product that
must use MFMA, a kernel with a compile error, and a module that hangs on import (timeout)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import pytest

from codegen.models import KernelConfig
from codegen.plan.kernel_list import KernelEntry
from codegen.compile.cache import CompileCache
from codegen.compile.engine import compile_entries
from codegen.formats.spec import load_spec

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton in this (test) venv: pip install -e '.[upstream]' there, never into a torch environment"),
]

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def tile_dot(A, B, C, stride_am, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a = tl.load(A + offs_m[:, None] * stride_am + offs_k[None, :])
    b = tl.load(B + offs_k[:, None] * BLOCK_N + offs_n[None, :])
    c = tl.dot(a, b)
    tl.store(C + offs_m[:, None] * BLOCK_N + offs_n[None, :], c)


@triton.jit
def broken(A, BLOCK: tl.constexpr):
    x = tl.load(A + tl.arange(0, BLOCK))
    tl.store(A + tl.arange(0, BLOCK), x + undefined_name)
'''
HANG = "import time\ntime.sleep(120)\n"


def _entry(kid: str, source: str, kernel: str, signature: str, wpe: int = 2) -> KernelEntry:
    return KernelEntry(id=kid, config=KernelConfig(kernel, "gfx908", "fp16", None, None, None, wpe, 4, 1),
                       hsaco=f"img/{kid}.hsaco", source=source, kernel_name=kernel, signature=signature,
                       perf="", functional="")


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    (root / "src").mkdir(parents=True)
    (root / "src" / "kernels.py").write_text(KERNELS)
    (root / "hang").mkdir()
    (root / "hang" / "hang.py").write_text(HANG)
    return root


DOT = [("dot32", "*fp16:16, *fp16:16, *fp32:16, i32, 32, 32, 32", 2),
       ("dot64", "*fp16:16, *fp16:16, *fp32:16, i32, 64, 64, 32", 1),
       ("dotbf", "*bf16:16, *bf16:16, *fp32:16, i32, 32, 32, 16", 2)]


def test_compile_real_kernels_with_cache_and_keep(tree, tmp_path):
    spec = load_spec(None).spec
    entries = [_entry(k, "src/kernels.py", "tile_dot", sig, wpe) for k, sig, wpe in DOT]
    entries.append(_entry("bad", "src/kernels.py", "broken", "*fp16:16, 64"))
    cache = CompileCache(tmp_path / "cache")
    keep = tmp_path / "keep"
    seen = []
    run = compile_entries(tree, entries, spec, jobs=2, timeout_s=240, cache=cache, keep=keep, on_progress=seen.append)
    assert len(seen) == 4 and run.compiled_now == 4 and run.from_cache == 0
    by_id = {r.id: r for r in run.results}
    for kid, _, _ in DOT:
        r = by_id[kid]
        assert r.status == "ok", r.error
        assert r.resources.mfma > 0 and r.resources.vgprs > 0 and r.resources.code_bytes > 0
        assert r.resources.lds_bytes >= 0 and r.occupancy and 1 <= r.occupancy <= 10
        assert r.occupancy == r.resources.llvm_occupancy  # our limits agree with LLVM's estimate
        assert (keep / "img" / f"{kid}.hsaco").read_bytes()[:4] == b"\x7fELF"
    bad = by_id["bad"]
    assert bad.status == "failed" and bad.verdict == "failed" and "undefined_name" in bad.error
    assert not (tree / "src" / "__pycache__").exists()  # the tree stays untouched

    again = compile_entries(tree, entries, spec, jobs=2, timeout_s=240, cache=cache)
    assert again.compiled_now == 0 and again.from_cache == 4
    assert [r.resources for r in again.results] == [r.resources for r in run.results]


@pytest.mark.skipif(shutil.which("llvm-readelf") is None, reason="needs llvm-readelf for the cross-check")
def test_resources_match_llvm_readelf_notes(tree, tmp_path):
    spec = load_spec(None).spec
    entries = [_entry("dot64", "src/kernels.py", "tile_dot", DOT[1][1], 1)]
    run = compile_entries(tree, entries, spec, jobs=1, timeout_s=240, cache=None, keep=tmp_path / "keep")
    notes = subprocess.run(["llvm-readelf", "--notes", str(tmp_path / "keep" / "img" / "dot64.hsaco")],
                           capture_output=True, text=True, check=True).stdout
    r = run.results[0].resources

    def note(key):
        return int(re.search(rf"\.{key}:\s+(\d+)", notes).group(1))

    assert (note("vgpr_count"), note("agpr_count"), note("sgpr_count")) == (r.vgprs, r.agprs, r.sgprs)
    assert (note("vgpr_spill_count"), note("sgpr_spill_count")) == (r.vgpr_spills, r.sgpr_spills)
    assert note("private_segment_fixed_size") == r.scratch_bytes


def test_timeout_kills_and_replaces_the_worker(tree):
    spec = load_spec(None).spec
    # equal expected cost: compiled in id order, so "zz-after" runs after the hang was killed
    entries = [_entry("hang", "hang/hang.py", "never", "i32"),
               _entry("dot32", "src/kernels.py", "tile_dot", DOT[0][1]),
               _entry("zz-after", "src/kernels.py", "tile_dot", DOT[2][1])]
    run = compile_entries(tree, entries, spec, jobs=1, timeout_s=8, cache=None)
    by_id = {r.id: r for r in run.results}
    assert by_id["hang"].status == "timeout" and "timeout" in by_id["hang"].error
    assert by_id["dot32"].status == "ok"
    assert by_id["zz-after"].status == "ok"  # a fresh worker took over
