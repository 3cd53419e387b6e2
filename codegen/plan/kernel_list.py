"""The kernels a tree's build compiles for the target GPUs, from the tree's OWN generator.

`generate_kernel_list` composes the tuning database the way the tree's CMake does, runs
`python -X utf8 -m v3python.generate --target_gpus GPU... --build_dir TMP` in a throwaway build
dir (PYTHONHASHSEED=0, no bytecode written into the tree) and reads its compile list
(`codegen.formats.compile_list`: one line per GPU kernel; CMake turns each line into one compiler
invocation).

Each `KernelEntry` carries everything needed to compile that kernel (source, kernel name, Triton
signature) and its `KernelConfig` (arch, dtype, head dim, tile, num_warps/num_stages/waves_per_eu).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from codegen.core import processes
from codegen.core.errors import UpstreamError, UserError
from codegen.models import KernelConfig
from codegen.models.dtypes import by_signature
from codegen.formats.compile_list import COMPILE_LIST, IMAGE_SUFFIX, CompileLine, entry_names, read_compile_list, rel
from codegen.models.image_name import ImageName, Spelling
from codegen.models.kernel import KernelEntry
from codegen.models.records import describe
from codegen.upstream import parse_constexpr as _constexpr
from codegen.plan.database import compose_database
from codegen.plan.database import last_line as _last_line
from codegen.plan.database import python_hint as _python_hint
from codegen.upstream.generator import importable
from codegen.plan.tree import (
    check_registered,
    generator_env,
    release_of,
)

_HEAD_DIM_ARGS = ("BLOCK_DMODEL", "D_HEAD")

GENERATOR_TIMEOUT_S = 1800.0  # upstream's generator lists a whole build in well under a minute


def generate_kernel_list(
    tree: str | Path,
    gpus: list[str],
    python: str = sys.executable,
    *,
    arch: str,
    tuning: bool = False,
    keep_build_dir: Path | None = None,
    env: dict[str, str] | None = None,
    timing: dict | None = None,
) -> list[KernelEntry]:
    """Run the tree's generator for `gpus` only and return the sorted kernel list.

    `tuning` lists a tuning build (AOTRITON_BUILD_FOR_TUNING=ON) instead of a normal one.
    `keep_build_dir` keeps the generator's outputs there (default: a throwaway dir).
    `timing["upstream_s"]` receives the seconds spent in upstream's code (database composition
    and generator)."""
    tree = Path(tree).resolve()
    info = release_of(tree)
    check_registered(info, list(gpus), arch)
    genv = generator_env(env)
    if keep_build_dir is not None:
        build = Path(keep_build_dir).resolve()
        if build.exists() and any(build.iterdir()):
            raise UserError(f"{build}: build dir exists and is not empty")
        build.mkdir(parents=True, exist_ok=True)
        cleanup = False
    else:
        build = Path(tempfile.mkdtemp(prefix="mi100-codegen-plan-"))
        cleanup = True
    try:
        start = time.perf_counter()
        with importable(info.adapter, tree) as pkg_env:
            genv.update(pkg_env)
            compose_database(info.adapter, info.root, build, python, genv)
            cmd = [python, "-X", "utf8", "-m", info.adapter.generator_module,
                   "--target_gpus", *gpus, "--build_dir", str(build)]
            if tuning:
                cmd.append("--build_for_tuning")
            try:
                proc = processes.run(cmd, cwd=tree, env=genv, capture_output=True, text=True,
                                     stdin=subprocess.DEVNULL, timeout=GENERATOR_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise UpstreamError(f"the generator of AOTriton {info.release} did not finish within "
                                    f"{GENERATOR_TIMEOUT_S / 60:g} min (killed)") from None
        if timing is not None:
            timing["upstream_s"] = time.perf_counter() - start
        if proc.returncode:
            raise UpstreamError(
                f"the generator of AOTriton {info.release} failed (rc {proc.returncode}): "
                + _last_line(proc.stderr or proc.stdout),
                hint=_python_hint(proc.stderr, python),
            )
        listing = build / COMPILE_LIST
        if not listing.is_file():
            raise UpstreamError(f"the generator of AOTriton {info.release} wrote no {COMPILE_LIST}")
        return parse_compile_list(listing, tree, build, info.adapter.image_names)
    finally:
        if cleanup:
            shutil.rmtree(build, ignore_errors=True)


def parse_compile_list(path: Path, tree: Path, build_dir: Path, names: Spelling) -> list[KernelEntry]:
    """The compile list at `path` -> sorted entries (its lines: codegen.formats.compile_list), each
    image named as the release spells `names` (0.13b+: from the clusters' entry lists, its file
    being a digest of its name)."""
    entries: dict[str, KernelEntry] = {}
    build_dir = Path(build_dir).resolve()
    tree = Path(tree).resolve()
    named = entry_names(build_dir) if names.digest_files else {}
    for lineno, line in read_compile_list(path):
        try:
            entry = _entry(tree, build_dir, line, _image_name(line, build_dir, names, named, f"{path}:{lineno}"))
        except ValidationError as exc:  # e.g. an image or a source outside its folder
            raise UpstreamError(f"{path}:{lineno}: unexpected compile-list line ({describe(exc.errors()[0])})") from None
        if entry.id in entries:
            raise UpstreamError(f"{path}:{lineno}: kernel image {entry.id} listed twice")
        entries[entry.id] = entry
    return sorted(entries.values(), key=sort_key)


def sort_key(e: KernelEntry) -> tuple:
    c = e.config
    return (c.family, c.dtype, c.head_dim or 0, c.name, e.id)


def _image_name(line: CompileLine, build: Path, names: Spelling, named: dict[str, str], where: str
                ) -> ImageName | None:
    """The name of a listed image (None: not spelt as its release spells names); UpstreamError when
    it disagrees with its line (kernel, compiler options, arch) or its file."""
    stem = os.path.basename(line.hsaco).removesuffix(IMAGE_SUFFIX)
    if names.digest_files:
        given = named.get(rel(line.hsaco, build))
        image = names.parse(given, line.kernel_name) if given is not None else None
    else:
        image = names.parse(stem)
    if image is None:
        return None
    if (image.file_stem != stem or image.kernel != line.kernel_name or image.arch != line.arch
            or (image.waves_per_eu, image.num_warps, image.num_stages) != (line.waves_per_eu, line.num_warps,
                                                                          line.num_stages)):
        raise UpstreamError(f"{where}: the image {stem} disagrees with its compile-list line or name ({image})")
    return image


def _entry(tree: Path, build: Path, line: CompileLine, image: ImageName | None) -> KernelEntry:
    name = os.path.basename(line.hsaco)
    kname, sig = line.kernel_name, line.signature
    functional, perf = (image.functional, image.perf_text) if image else ("", "")
    dtype_sig = image.spelling.functional_dtype(functional) if image else ""
    source = rel(line.source, tree)
    consts = _constants(os.path.join(str(tree), source), kname, sig)
    head_dim = next((consts[a] for a in _HEAD_DIM_ARGS if isinstance(consts.get(a), int)), None)
    if head_dim is None and image:
        head_dim = image.spelling.functional_head_dim(functional)
    block_m = consts.get("BLOCK_M") if isinstance(consts.get("BLOCK_M"), int) else None
    block_n = consts.get("BLOCK_N") if isinstance(consts.get("BLOCK_N"), int) else None
    plv = consts.get("PRE_LOAD_V") if isinstance(consts.get("PRE_LOAD_V"), bool) else None
    if not dtype_sig:  # a functional that names no type: the dtype is Q's type in the signature
        dtype_sig = _q_type(os.path.join(str(tree), source), kname, sig)
    known = by_signature(dtype_sig)
    dtype = known.short if known else (dtype_sig.strip("*").split(":")[0] or "unknown")
    return KernelEntry(
        id=name.removesuffix(IMAGE_SUFFIX),
        config=config_of(kname, line.arch, dtype, head_dim, block_m, block_n, line.waves_per_eu, line.num_warps,
                         line.num_stages, plv),
        hsaco=rel(line.hsaco, build), source=source, kernel_name=kname, signature=sig,
        perf=perf, functional=functional,
    )


def config_of(family: str, arch: str, dtype: str, head_dim: int | None, block_m: int | None,
              block_n: int | None, wpe: int, warps: int, stages: int, plv: bool | None) -> KernelConfig:
    """The KernelConfig of a compile-list kernel: every axis for the tunable families, the axes
    the kernel has for the others (e.g. bwd_preprocess.gfx908.fp16.d64.M128.wpe2.w4.s1)."""
    if not block_m:
        block_m = block_n = None
    elif not block_n:
        block_n = None
    cfg = KernelConfig(family, arch, dtype, head_dim, block_m, block_n, wpe, warps, stages, plv)
    if cfg.tunable and family != "attn_fwd":
        cfg = cfg.vary(pre_load_v=None)  # PRE_LOAD_V is an attn_fwd axis only
    return cfg


def _q_type(source: str, kname: str, sig: str) -> str:
    """The Triton type of the kernel's Q argument (else of its first tensor of a known dtype)."""
    values = [v.strip() for v in sig.split(",")]
    names = kernel_arg_names(source, kname)
    if names is not None and len(names) == len(values) and "Q" in names:
        return values[names.index("Q")]
    return next((v for v in values if by_signature(v)), "")


_AXIS_ARGS = (*_HEAD_DIM_ARGS, "BLOCK_M", "BLOCK_N", "PRE_LOAD_V")  # the constants a config needs


def _constants(source: str, kname: str, sig: str) -> dict:
    """The constant arguments of the signature that name a config axis, by parameter name
    (empty when unknown). Only those are parsed: a signature has ~70 values, a list thousands."""
    names = kernel_arg_names(source, kname)
    values = sig.split(",")
    if names is None or len(names) != len(values):
        return {}
    out = {}
    for n, s in zip(names, values):
        if n in _AXIS_ARGS:
            v = _constexpr(s.strip())
            if v is not None:
                out[n] = v
    return out


@lru_cache(maxsize=256)
def kernel_arg_names(source: str, kname: str) -> tuple[str, ...] | None:
    """Parameter names of Triton kernel `kname` reachable from `source`, found statically
    (the def, or `from module import kname` chains within the source's directory)."""
    return _arg_names(Path(source), kname, 0)


def _arg_names(path: Path, name: str, depth: int) -> tuple[str, ...] | None:
    if depth > 8 or not path.is_file():
        return None
    try:
        module = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError):
        return None
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return tuple(a.arg for a in node.args.args)
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    target = path.parent / (node.module.replace(".", "/") + ".py")
                    return _arg_names(target, alias.name, depth + 1)
    return None
