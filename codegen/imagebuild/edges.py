"""Upstream's per-kernel build edge, reproduced in a `build.ninja` of its own.

The trees' `v3src/CMakeLists.txt` turns each line of the generator's compile list
(`codegen.formats.compile_list`) into one ninja edge: `cmake -E env VIRTUAL_ENV=VENV
TRITON_CACHE_DIR=BUILD/triton-cache TRITON_F32_DEFAULT=ieee TRITON_STORE_BINARY_ONLY=1 VENV/bin/python TREE/v3python/compile.py SRC --kernel_name K -o OUT
-g 1,1,1 --num_warps W --num_stages S --waves_per_eu E --target ARCH --signature SIG --timeout 0`.
`write_kernel_ninja` writes exactly these edges for a kernel list, so the kernel-compile phase of
an image build runs through real ninja, both routes, where no HIP toolchain is installed (the
benchmark `scripts/bench_build_compile.py` and the tests of the compile service); `build` itself
always runs the tree's own CMake-generated build.ninja.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from codegen.plan.kernel_list import KernelEntry


def _esc(text: str) -> str:
    return text.replace("$", "$$")


def kernel_command(tree: Path, compiler: Path, build_dir: Path, venv: Path, e: KernelEntry, cmake: str) -> list[str]:
    return [cmake, "-E", "env", f"VIRTUAL_ENV={venv}", f"TRITON_CACHE_DIR={build_dir / 'triton-cache'}",
            "TRITON_F32_DEFAULT=ieee", "TRITON_STORE_BINARY_ONLY=1", str(venv / "bin" / "python"), str(compiler),
            str(tree / e.source), "--kernel_name", e.kernel_name, "-o", str(build_dir / e.hsaco), "-g", "1,1,1",
            "--num_warps", str(e.config.num_warps), "--num_stages", str(e.config.num_stages),
            "--waves_per_eu", str(e.config.waves_per_eu), "--target", e.config.arch, "--signature", e.signature,
            "--timeout", "0"]


def write_kernel_ninja(build_dir: Path, tree: Path, compiler: Path, venv: Path, entries: list[KernelEntry],
                       cmake: str = "cmake") -> Path:
    """BUILD/build.ninja with one edge per kernel (output: its .hsaco), as upstream's CMake writes them,
    and `install` (the default) over all of them."""
    build_dir = Path(build_dir)
    lines = ["ninja_required_version = 1.5", "rule kernel", "  command = $cmd", "  description = Generating $out", ""]
    outs = []
    for e in entries:
        out = build_dir / e.hsaco
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = " ".join(shlex.quote(a) for a in kernel_command(Path(tree), Path(compiler), build_dir, Path(venv), e,
                                                               cmake))
        outs.append(_esc(str(out)).replace(" ", "$ ").replace(":", "$:"))
        lines += [f"build {outs[-1]}: kernel", f"  cmd = {_esc(cmd)}", ""]
    lines += [f"build install: phony {' '.join(outs)}", "default install", ""]
    path = build_dir / "build.ninja"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
