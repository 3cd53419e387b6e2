"""A warm compile worker: imports Triton and the tree's kernel modules once, then compiles one
kernel per request, the way the tree's compiler driver (v3python/compile.py) asks Triton to:
an `ASTSource` built from the AOT signature string, `GPUTarget('hip', arch, warp_size)` and the
options num_warps / num_stages / waves_per_eu.

Runs in a worker of the one pool (codegen.core.pool, spawned): `init` sets the environment and
imports Triton once, `handle` compiles one task dict into one result dict.
"""

from __future__ import annotations

import json
import os
import re
import sys
import sysconfig
import time
import traceback
from pathlib import Path

from codegen.upstream import parse_constexpr as _constexpr
from codegen.upstream import signature_constant
from codegen.upstream.kernel_args import import_flat

_MODULES: dict[str, object] = {}
parse_resources = None  # bound in serve()


def _kernel(source: str, name: str):
    mod = _MODULES.get(source)
    if mod is None:
        path = Path(source)
        mod = _MODULES[source] = import_flat(path.parent, path.stem)
    return getattr(mod, name)


def compile_kernel(task: dict) -> dict:
    """Compile one kernel; return resources' raw material (assembly, image, shared bytes)."""
    # import-time dependency: Triton is the worker's interpreter's, not the parent's, which
    # imports this module too; imported once per worker process
    import triton
    from triton.backends.compiler import GPUTarget

    kernel = _kernel(task["source"], task["kernel_name"])
    sig = [s.strip() for s in task["signature"].split(",")]
    names = kernel.arg_names
    if len(names) != len(sig):
        raise ValueError(f"signature has {len(sig)} entries, kernel {task['kernel_name']} takes {len(names)}")
    hints = {(i,): _constexpr(s.split(":")[1]) for i, s in enumerate(sig) if ":" in s}
    hints = {k: v for k, v in hints.items() if v is not None}
    constants = {names[i]: c for i, s in enumerate(sig) if (c := signature_constant(s)) is not None}
    signature = {names[i]: s.split(":")[0] for i, s in enumerate(sig)}
    for k in constants:
        signature[k] = "constexpr"
    # compile.py's order (every 16 before every 8): Triton's metadata `hash` is taken over str(attrs)
    attrs = {k: [("tt.divisibility", 16)] for k, v in hints.items() if v == 16}
    attrs.update({k: [("tt.divisibility", 8)] for k, v in hints.items() if v == 8})
    src = triton.compiler.ASTSource(fn=kernel, constexprs=constants, signature=signature, attrs=attrs)
    target = GPUTarget("hip", task["arch"], task["warp_size"])
    backend = triton.compiler.make_backend(target)
    opts = backend.parse_options({
        "num_warps": task["num_warps"], "num_stages": task["num_stages"], "waves_per_eu": task["waves_per_eu"],
    })
    compiled = triton.compile(src, target=target, options=opts.__dict__)
    return {
        "sidecar": sidecar_json(compiled.metadata),
        "amdgcn": compiled.asm.get("amdgcn", ""),
        "hsaco": bytes(compiled.kernel),
        "shared": int(getattr(compiled.metadata, "shared", 0) or 0),
        "llir": compiled.asm.get("llir", ""),
    }


def sidecar_json(metadata) -> str:
    """The `.json` the tree's compile.py writes beside the image, byte for byte: Triton's metadata
    without the target, `compile_status` last, `json.dump(indent=2)` (the image packer, aks2,
    reads `shared`, `num_warps` and `warp_size` from it; `extern_libs` and `hash` carry the path
    of the Triton install)."""
    di = metadata._asdict()
    del di["target"]
    di["compile_status"] = "Complete"
    return json.dumps(di, indent=2)


def first_error_line(exc: BaseException) -> str:
    """`Type: message` with the first line that says what went wrong. Triton's CompilationError
    reads `at L:C:` / source excerpt / `^` marker / the error: take the line after the marker."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    marker = next((i for i, ln in enumerate(lines) if set(ln) == {"^"}), None)
    if marker is not None and marker + 1 < len(lines):
        line = lines[marker + 1]
    else:
        line = next((ln for ln in lines if not re.match(r"^at \d+:\d+:?$", ln)), "")
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def own_site_first() -> None:
    """In another interpreter (the build venv's), spawn gave us the parent's sys.path: put this
    interpreter's own site-packages first, so `triton` is its own and not the parent's (the torch
    environment's); our modules and their dependencies still come from the parent's entries."""
    own = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    own = [p for i, p in enumerate(own) if p and p not in own[:i]]
    sys.path[:] = own + [p for p in sys.path if p not in own]


def init(slot, env: dict[str, str], own_site: bool = False):
    """A worker's start: its environment, then the warm import of Triton (once per worker)."""
    if own_site:
        own_site_first()
    os.environ.update(env)
    sys.dont_write_bytecode = True
    global parse_resources
    # import-time dependency: these load after the worker's site-packages and environment are set
    from codegen.compile.resources import parse_resources
    import triton  # import-time dependency (after the environment): the warm import, once per worker

    return None, {"triton": getattr(triton, "__version__", None)}


def handle(_state, task: dict, names, report) -> None:
    """Compile one task (one step): every compile failure is a result."""
    report.begin(names)
    t0 = time.perf_counter()
    try:
        raw = compile_kernel(task)
        elapsed = time.perf_counter() - t0
        res = parse_resources(raw["amdgcn"], raw["hsaco"], raw["shared"], raw["llir"])
        out = {"ok": True, "id": task["id"], "compile_s": elapsed, "hsaco": raw["hsaco"],
               "resources": res.model_dump(), "sidecar": raw["sidecar"]}
        if task.get("keep_asm"):
            out["amdgcn"] = raw["amdgcn"]
    except Exception as exc:  # noqa: BLE001 - every compile failure is a result
        out = {"ok": False, "id": task["id"], "compile_s": time.perf_counter() - t0,
               "error": first_error_line(exc),
               "traceback": "".join(traceback.format_exception(exc))[-4000:]}
    report.end(out)
