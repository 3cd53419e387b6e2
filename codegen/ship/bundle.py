"""`bundle build`: the AOTriton runtime of an applied tree built against one HIP major's headers
(the private sysroot), the tree's kernel images, a manifest, checked, written as one file.

The runtime is built by the build stage (`codegen.imagebuild.builder.build_tree`, unchanged) with the
sysroot's `usr` first on CMAKE_PREFIX_PATH, so CMake's `find_package(hip)` takes that major's
config, headers and `libamdhip64.so.<N>`, in a build folder of its own per major
(`BUILD-hip<N>`). Kernel images do not depend on the HIP version: with `--images PREFIX` (an
image install of the same tree and spec by `mi100-codegen build`) the runtime is built
`--noimage` and the images are taken from PREFIX, then verified against this build's own
dispatch tables (every kernel they can select packed, non-empty); without it the build stage
builds both. The bundle carries the spec's GPUs' tuning rows (`tuning-rows.json`, rows.py), read
from the tree before the build so a tree without a database fails first. `bundle check`'s checks
(check.py) run on the staged folder before the file is written (the rows against the tree, which
must be the ones carried); a failed check writes nothing. `add_rows` gives a bundle made before
bundles carried rows the rows of the tree it was built from.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from rich.console import Console

from codegen import __version__
from codegen.core import processes
from codegen.core.ui import printable
from codegen.formats.elf import read_dynamic
from codegen.core.errors import UpstreamError, UserError
from codegen.apply.lock import read_lock
from codegen.formats.spec import load_spec
from codegen.render.workspace import COMPILE_REPORT, overlay_results
from codegen.ship.layout import torch_lines
from codegen.upstream.releases import IMAGES_DIR
from codegen.core.fsutil import sha256
from codegen.formats.bundle_zip import FORMAT, MANIFEST, SPEC, bundle_name, extract, manifest_of, open_bundle, write_bundle
from codegen.models.bundle import BundleManifest
from codegen.ship.check import CheckReport, check_extracted
from codegen.ship.dispatch import LABEL
from codegen.ship.rows import ROWS, carry_rows, read_rows, tree_database
from codegen.ship.sysroot import ensure_sysroot


class BundleBuildError(UpstreamError):
    """The bundle's runtime or images failed to build, or its checks failed (exit 3)."""


@contextmanager
def _prefix_path(first: Path) -> Iterator[None]:
    old = os.environ.get("CMAKE_PREFIX_PATH")
    os.environ["CMAKE_PREFIX_PATH"] = os.pathsep.join([str(first)] + ([old] if old else []))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CMAKE_PREFIX_PATH", None)
        else:
            os.environ["CMAKE_PREFIX_PATH"] = old


@dataclass
class BundleResult:
    path: Path | None
    manifest: BundleManifest
    check: CheckReport
    seconds: dict


@dataclass(frozen=True)
class KernelBuild:
    """How `bundle build` has the build stage compile its kernels (BuildOptions' fields of the same
    names); images taken with `--images` compile nothing."""

    python: str | None = None            # None: the build venv of the spec's Triton
    triton_version: str | None = None
    no_cache: bool = False
    cache_dir: Path | None = None
    show_progress: bool = False
    aiter_stand_in: bool = False
    kernels: str = "dispatched"          # 'dispatched' or 'all' (codegen.imagebuild.reach)


def _copy_images(src: Path, dest: Path, arch: str) -> None:
    s = src / "lib" / IMAGES_DIR / f"amd-{arch}"
    if not s.is_dir() or not any(s.rglob("*")):
        raise UserError(f"{src}: no kernel images for {arch} (lib/{IMAGES_DIR}/amd-{arch})",
                        hint=f"build them: mi100-codegen build TREE --prefix {src}")
    d = dest / "lib" / IMAGES_DIR / f"amd-{arch}"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(s, d, symlinks=False)


def build_bundle(tree: Path, hip: int, *, spec_path: Path | None, out_dir: Path, images: Path | None,
                 build_dir: Path | None, jobs: int, console: Console,
                 progress: Callable[[str], None], kernel_build: KernelBuild = KernelBuild()) -> BundleResult:
    # CLI start-up: `bundle check` loads this module too; the build stage loads when a bundle is built
    from codegen.imagebuild.builder import BuildOptions, build_tree, check_tree

    t0 = time.monotonic()
    project = project_provenance()   # the code this run loaded, before a checkout can move on
    tree = tree.resolve()
    bdir = (build_dir or tree / f"build-hip{hip}").resolve()
    prefix = bdir / "mi100-codegen" / "bundle-prefix"
    opts = BuildOptions(tree, prefix, bdir, jobs, noimage=images is not None, spec_path=spec_path,
                        python=kernel_build.python, triton_version=kernel_build.triton_version,
                        no_cache=kernel_build.no_cache, cache_dir=kernel_build.cache_dir,
                        show_progress=kernel_build.show_progress, aiter_stand_in=kernel_build.aiter_stand_in,
                        kernels=kernel_build.kernels)
    # exit 2 before anything is fetched or built: the build stage's own checks, made once (the spec
    # resolved, the overlay rendered and compared), and a tree without a tuning database
    checked = check_tree(opts)
    adapter, loaded, _state = checked
    spec = loaded.spec
    rows = rows_member(tree, spec.gpus)
    sysroot = ensure_sysroot(hip, progress=progress)
    t_sysroot = time.monotonic() - t0
    with _prefix_path(sysroot.prefix):
        rep = build_tree(replace(opts, hip_prefix=sysroot.prefix), console, checked)
    kernels = _built_kernels(tree, hip, rep, adapter, prefix, bdir, images)
    t_build = time.monotonic() - t0 - t_sysroot
    lib = Path(rep.verification.library)
    dyn = read_dynamic(lib)
    stage = bdir / "mi100-codegen" / "bundle-stage"
    files = _stage_files(stage, lib, prefix, loaded.path, rows)
    data = _manifest(adapter, rep, hip, spec.target_string, lib, dyn, sysroot, kernels, files, project)
    data["built_with"]["images"] = f"taken from {images}" if images is not None else "built by this build folder"
    data["compile_report"] = _compile_report(loaded)
    where = f"{out_dir / bundle_name(adapter.release, rep.arch, hip)}: {MANIFEST}"
    progress(f"checking the staged bundle ({len(files)} files)")
    t1 = time.monotonic()
    source = read_rows(tree=tree, carried=rows)   # the tree's rows, compared with the staged ones
    check = check_extracted(stage, manifest_of(data, where), progress=progress, rows=source)
    t_check = time.monotonic() - t1
    data["verified"] = {
        "where": "CPU-only machine: ELF read with codegen.formats.elf, dispatch emulated by the stub HIP runtime",
        "link_identity": [c.as_json() for c in check.claims],
        "dispatch": check.dispatch.summary() if check.dispatch else None,
        "negative_controls": [c.as_json() for c in check.controls],
        "tuning_rows": check.rows_claim.as_json() if check.rows_claim else None,
        "forced_fused": check.forced.as_json() if check.forced else None,
        "coverage": [c.as_json() for c in check.coverage.claims] if check.coverage else None,
    }
    manifest = manifest_of(data, where)
    seconds = {"sysroot": round(t_sysroot, 1), "build": round(t_build, 1), "check": round(t_check, 1)}
    if not check.ok or source.differ:   # differ: the tree's database changed during the build
        return BundleResult(None, manifest, check, seconds)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / bundle_name(adapter.release, rep.arch, hip)
    write_bundle(dest, manifest, files)
    shutil.rmtree(stage, ignore_errors=True)
    seconds["total"] = round(time.monotonic() - t0, 1)
    return BundleResult(dest, manifest, check, seconds)


def _built_kernels(tree: Path, hip: int, rep, adapter, prefix: Path, bdir: Path, images: Path | None):
    """The install check of the build (with `images`: of the prefix those images are copied into,
    verified again; a `Verification`); a build with problems is a BundleBuildError."""
    # CLI start-up: `bundle check` loads this module too; the build stage loads when a bundle is built
    from codegen.imagebuild.reach import confirm_left_out, read_prefix_reach
    from codegen.imagebuild.verify import verify_install

    problems = list(rep.verification.problems)
    if images is not None:
        # what the images' build left out: never believed, proven again from this build folder's
        # generator output (the same tree and spec); a record it does not prove is refused
        reach = read_prefix_reach(images.resolve())
        if reach is not None:
            unproven = confirm_left_out(reach, bdir, tree)
            if unproven:
                raise UserError(f"--images {images}: its reach record says its images lack "
                                f"{len(reach.packages_left_out)} packages; {unproven[0]}"
                                + (f" (and {len(unproven) - 1} more)" if len(unproven) > 1 else ""),
                                hint=f"build the images again: mi100-codegen build {tree} --prefix {images}")
            rep.reach, rep.kernels, rep.kernels_left_out = reach, "dispatched", reach.kernels_left_out
        else:
            rep.reach, rep.kernels, rep.kernels_left_out = None, "all", 0
        _copy_images(images.resolve(), prefix, rep.arch)
        ver = verify_install(prefix, bdir, version=adapter.version, arch=rep.arch, images=True,
                             v3_api=adapter.exports_v3_api, v2_attn=adapter.exports_v2_attn,
                             image_format=adapter.image_format, names=adapter.image_names, reach=reach)
        problems += ver.problems
        kernels = ver
    else:
        kernels = rep.verification
    if problems:
        raise BundleBuildError(f"{tree}: the HIP {hip} build is incomplete: " + "; ".join(problems[:5]),
                               hint=f"see {rep.log}")
    return kernels


def rows_member(tree: Path, gpus) -> bytes:
    """The bundle's `tuning-rows.json`: the rows of `gpus` (the spec's) of the tree's tuned tables."""
    return carry_rows(tree_database(tree), list(gpus))


def _stage_files(stage: Path, lib: Path, prefix: Path, spec_file: Path, rows: bytes) -> dict[str, bytes]:
    """Copy the bundle's members into a fresh `stage` folder; their bytes by relative path."""
    if stage.exists():
        shutil.rmtree(stage)
    (stage / "lib").mkdir(parents=True)
    shutil.copy2(lib, stage / "lib" / lib.name)
    shutil.copytree(prefix / "lib" / IMAGES_DIR, stage / "lib" / IMAGES_DIR)
    shutil.copytree(prefix / "include", stage / "include")
    shutil.copy2(spec_file, stage / SPEC)
    (stage / ROWS).write_bytes(rows)
    return _staged(stage)


def _staged(stage: Path) -> dict[str, bytes]:
    return {p.relative_to(stage).as_posix(): p.read_bytes() for p in sorted(stage.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _files_record(files: dict[str, bytes]) -> dict:
    return {n: {"sha256": sha256(b), "size": len(b)} for n, b in sorted(files.items())}


def add_rows(bundle: Path, tree: Path, dest: Path) -> Path:
    """A bundle made before bundles carried tuning rows, written again to `dest` with the rows of
    the applied tree it was built from (the same `rows_member` as `bundle build`); the tree must
    hold the spec the bundle was built from (its lock's spec sha256, exit 2 otherwise)."""
    b = open_bundle(bundle)
    lock = read_lock(tree)
    if lock is None or lock.spec_sha256 != b.manifest.spec.sha256:
        raise UserError(f"{tree}: not the applied tree {bundle.name} was built from (its spec sha256 "
                        f"{b.manifest.spec.sha256[:12]}…, the tree's "
                        f"{lock.spec_sha256[:12] + '…' if lock else 'none: not applied'})")
    with tempfile.TemporaryDirectory(prefix="mi100-bundle-") as td:
        stage = extract(b, Path(td) / "stage")
        (stage / ROWS).write_bytes(rows_member(tree, load_spec(stage / SPEC).spec.gpus))
        files = _staged(stage)
    manifest = manifest_of(dict(b.manifest.to_json(), files=_files_record(files),
                                rows_added={"to": bundle.name, "from_tree": Path(tree).resolve().name}),
                           f"{dest}: {MANIFEST}")
    write_bundle(dest, manifest, files)
    return dest


BUILDER_ENV = "MI100_CODEGEN_BUILDER"
"""Who builds (the release workflow sets its run's URL); recorded as the manifest's `built_with.builder`."""
_PROJECT_PATHS = ("codegen", "rules", "templates", "tuning")


def project_provenance() -> dict:
    """The mi100-codegen building: its version, and when it runs from a git checkout, the commit
    and whether tracked files of the package or its data differ from it (the bundle index's
    provenance)."""
    out: dict = {"version": __version__}
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return out
    git = ["git", "-C", str(root)]
    try:
        head = processes.run([*git, "rev-parse", "HEAD"], timeout=30, capture_output=True, text=True)
        dirty = processes.run([*git, "status", "--porcelain", "--untracked-files=no", "--", *_PROJECT_PATHS],
                              timeout=30, capture_output=True, text=True)
    except (OSError, subprocess.TimeoutExpired):
        return out
    commit = head.stdout.strip()
    if head.returncode == 0 and dirty.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", commit):
        out.update(commit=commit, modified=bool(dirty.stdout.strip()))
    return out


def _manifest(adapter, rep, hip: int, target: str, lib: Path, dyn, sysroot, verification,
              files: dict[str, bytes], project: dict | None = None) -> dict:
    """The bundle's manifest as data, before its `verified` record (`manifest_of` makes it the model);
    `rep`: the build's BuildReport, `verification`: the install check of its images."""
    kernels = verification.summary()
    hip_needed = [n for n in dyn.needed if n.startswith("libamdhip64")]
    return {
        "format": FORMAT,
        "label": LABEL,
        "release": adapter.release,
        "version": ".".join(map(str, adapter.version)),
        "torch_lines": torch_lines(adapter.release),
        "arch": rep.arch,
        "device_target": target,
        "hip_major": hip,
        "spec": {"name": rep.spec, "sha256": rep.spec_sha256, "file": SPEC},
        "library": {
            "file": f"lib/{lib.name}", "soname": dyn.soname, "needed": list(dyn.needed),
            "rpath": list(dyn.rpath), "runpath": list(dyn.runpath), "hip_runtime": hip_needed,
            "needs": {"glibc": dyn.highest("GLIBC"), "glibcxx": dyn.highest("GLIBCXX")},
            "hip_imports": dict(x for x in dyn.import_versions if x[0].startswith("hip")),
        },
        "built_with": {
            "project": project or project_provenance(), "builder": printable(os.environ.get(BUILDER_ENV) or "local")[:200],
            "hip_headers": {k: v.version for k, v in sysroot.record.packages.items()},
            "hip_suite": sysroot.record.suite, "toolchain": rep.toolchain.summary(), "machine": platform.machine(),
            "build_log": rep.log,
            # this run's kernel compiles (codegen.compile.cache): 0 compiled when the images came from --images
            "kernels_compiled": rep.kernels_compiled, "kernels_cached": rep.kernels_cached,
            "aiter": rep.aiter,   # 'placed'/'kept: …' with --aiter-stand-in (codegen.imagebuild.aiter)
            # --kernels: what no dispatch table selects and was left out (codegen.imagebuild.reach)
            "kernels": rep.kernels, "reach": rep.reach.summary() if rep.reach else None,
        },
        "kernels": {k: kernels.get(k) for k in ("kernels_referenced", "kernels_packed", "kernels_left_out",
                                                 "missing_count", "empty_count", "packages", "kernels_by_family")
                    if k in kernels},
        "files": _files_record(files),
    }


def _compile_report(loaded) -> dict | None:
    """The summary of the compile report the overlay was rendered with (`precompile
    --tuning-report`: which configs compile clean, which spill; apply caps the seeded rows by it),
    read through its one reader from where render takes it for the tree's spec; None without one."""
    # CLI start-up: `bundle check` loads this module too; render's inputs load when a bundle is built
    from codegen.render.inputs import read_compile_report

    path = overlay_results(loaded).get(COMPILE_REPORT)
    report = read_compile_report(path) if path is not None else None
    if report is None:
        return None
    configs = report.configs.values()
    return {"sha256": sha256(path.read_bytes()), "arch": report.arch, "gpu": report.gpu,
            "release": report.release, "triton": report.triton, "configs": len(configs),
            "verdicts": dict(sorted(Counter(c.verdict for c in configs).items())),
            "kernels": sum(c.kernels for c in configs)}
