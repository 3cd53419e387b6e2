"""`bundle check`: everything a CPU can prove about a bundle.

1. Integrity: every member against the manifest (archive.open_bundle).
2. The bundle's verdict (codegen.ship.verdict, the one function `torch install --bundle` and
   `bundle index` call too): the library's identity (codegen.ship.identity: the HIP runtime of the
   bundle's major and no other, no RPATH or RUNPATH but `$ORIGIN`, every HIP import bound to a
   version node the real runtime of that major defines, read from the private sysroot's library,
   `hipGetDevicePropertiesR0600` with HIP >= 6, the GLIBC/GLIBCXX needs, the release and every ELF
   fact the manifest states), one AOTriton library, every image package the library names packed
   (and at least one named), every kernel package decompressing. A bundle failing it is refused
   here as install refuses it: nothing below runs.
3. Emulated dispatch (dispatch.py): check_gpu, forward and backward of every case, and the
   tuning-database row each tuned launch got (rows.py): the spec GPU's row for the case's inputs,
   its configuration the launched one's; rows read from the applied tree the bundle was built
   from when it is given (and compared with the rows the bundle carries), else from the rows the
   bundle carries (`tuning-rows.json`); a bundle made before bundles carried rows names none
   without the tree (no verdict, not a failure).
4. Forcing the fused backend (only a bundle built with `--kernels dispatched` that left fused
   packages out, codegen.imagebuild.reach): the backward of one functional whose fused package the
   bundle holds and of one it left out (the manifest's `built_with.reach` names both, as the
   build read them from the kernels' signatures), each with `attn_options.force_backend_index` set to the
   fused backend, which no PyTorch call does. The first must launch the fused kernel; the second
   must come back with an error, no fused launch, and the driver still running (no crash).
5. Coverage (coverage.py): every dtype, head dim and variant the spec declares dispatched (the
   cases are made from those axes: dispatch.check_cases), every packed package loaded by some
   case (or said why PyTorch's calls may not reach it with the cases' inputs).
6. Executed (only with `execute`): the library's own forward and backward of the spec's executed
   matrix run through the same dispatch with every kernel executed on an emulated GPU and the
   results compared with an fp64 reference (execute.py).
7. Negative controls that must fail, each named: a missing image (the .aks2 package, or 0.13b's
   image-zip member, of one kernel the cases used removed), a code object of another arch (the stub's device mach value set to another
   arch's), a library linked against another HIP major (the stub of the other major in its place).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from codegen.formats.elf import AMDGPU_MACH, read_dynamic
from codegen.core.resources import user_cache_dir
from codegen.formats.spec import load_spec
from codegen.formats.bundle_zip import SPEC, Bundle, extract, open_bundle
from codegen.models.bundle import BundleManifest
from codegen.models.dtypes import DTYPE_INFO
from codegen.formats.op_table import FUSED_BACKEND_INDEX, FUSED_FAMILY
from codegen.models.cases import SHAPES
from codegen.ship.coverage import Coverage, coverage
from codegen.ship.identity import Claim
from codegen.models.execute import ExecuteReport
from codegen.ship.dispatch import (LABEL, HIP_SUCCESS, DispatchCase, DispatchReport, check_cases, dispatch_cases,
                                   remove_image, run_dispatch)
from codegen.ship.execute import execute_extracted
from codegen.ship.rows import (ROWS, RowMatch, RowsSource, TuningDatabase, match_report, read_rows, summary,
                               tree_database)
from codegen.ship.stub import build_stub
from codegen.ship.sysroot import HIP_SOURCES, ensure_sysroot
from codegen.ship.verdict import bundle_verdict, refused
from codegen.upstream.releases import IMAGES_DIR, by_release

NO_ROWS = "not named (this bundle carries no rows; give --tree)"


@dataclass
class CheckReport:
    bundle: str
    manifest: BundleManifest
    claims: list[Claim] = field(default_factory=list)
    dispatch: DispatchReport | None = None
    controls: list[Claim] = field(default_factory=list)
    rows: list[RowMatch] = field(default_factory=list)   # empty when no rows were read
    rows_claim: Claim | None = None                      # None: no rows to read (rows_note says why)
    rows_note: str = ""
    forced: Claim | None = None                          # None: the bundle left nothing out
    coverage: Coverage | None = None
    executed: ExecuteReport | None = None                # None: not asked for (--execute)

    @property
    def ok(self) -> bool:
        return (all(c.ok for c in self.claims) and self.dispatch is not None and self.dispatch.ok
                and (self.executed is None or self.executed.ok)
                and self.coverage is not None and self.coverage.ok
                and bool(self.controls) and all(c.ok for c in self.controls)
                and (self.rows_claim is None or self.rows_claim.ok) and (self.forced is None or self.forced.ok))

    def as_json(self) -> dict:
        d = self.dispatch
        return {
            "bundle": self.bundle, "label": LABEL, "ok": self.ok,
            "release": self.manifest.release, "arch": self.manifest.arch,
            "hip_major": self.manifest.hip_major,
            "link_identity": [c.as_json() for c in self.claims],
            "dispatch": None if d is None else {
                **d.summary(),
                "cases": [{"case": c.case, "ok": c.ok, "fwd": c.fwd, "bwd": c.bwd, "launches": c.launches,
                           "kernels": c.kernels, "violations": c.violations,
                           "rows": [m.as_json() for m in self.rows if m.case == c.case]} for c in d.cases],
                "stderr": d.stderr_tail},
            "coverage": None if self.coverage is None else self.coverage.as_json(),
            "negative_controls": [c.as_json() for c in self.controls],
            "tuning_rows": None if self.rows_claim is None else self.rows_claim.as_json(),
            "forced_fused": None if self.forced is None else self.forced.as_json(),
            "tuning_rows_note": self.rows_note or None,
            "executed": None if self.executed is None else self.executed.model_dump(mode="json"),
        }


def _dispatch(root: Path, manifest: BundleManifest, hip: int, *, mach_arch: str | None = None,
              stub_major: int | None = None, cache: Path, progress: Callable[[str], None],
              cases: list[DispatchCase] | None = None) -> DispatchReport:
    arch = manifest.arch
    spec = load_spec(root / SPEC).spec
    sysroot = ensure_sysroot(stub_major or hip, progress=progress)
    headers = ensure_sysroot(hip, progress=progress)
    stub = build_stub(sysroot.include, sysroot.runtime, cache / "stub")
    lib = root / manifest.library.file
    return run_dispatch(lib=lib, prefix=root, images=root / "lib" / IMAGES_DIR, hip_include=headers.include,
                        stub=stub, arch=mach_arch or arch, cases=cases or check_cases(spec), cache=cache / "driver",
                        target=spec.target_string, wave=spec.warp_size)


def _forced_case(name: str, f) -> DispatchCase | None:
    """A backward that forces the fused backend for a fused functional as the build recorded it
    (codegen.plan.reach.fused_functional; None: not one): a head dim below BLOCK_DMODEL where the
    functional pads its head."""
    if not isinstance(f, dict) or f.get("Q") not in DTYPE_INFO or \
            not str(f.get("BLOCK_DMODEL", "")).isdigit():
        return None
    block, yes = int(f["BLOCK_DMODEL"]), ("True", "1", "true")
    return DispatchCase(name, f["Q"], block - 8 if f.get("PADDED_HEAD") in yes else block,
                        str(f.get("CAUSAL_TYPE", "0")) != "0", SHAPES[1], bias=str(f.get("BIAS_TYPE", "0")) != "0",
                        dropout=0.25 if f.get("ENABLE_DROPOUT") in yes else 0.0, force_backend=FUSED_BACKEND_INDEX)


def _label(f: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in f.items())


def check_forced(rep: CheckReport, root: Path, manifest: BundleManifest, hip: int, cache: Path,
                 progress: Callable[[str], None]) -> None:
    """Forcing the fused backend on a held and on a left-out functional (module doc, item 4)."""
    reach = manifest.built_with.reach if manifest.built_with else None
    if reach is None or not reach.left_out:
        return
    where = "CPU: emulated dispatch, attn_options.force_backend_index set (not a PyTorch call)"
    gone = reach.left_out[0].functional
    held = reach.held
    lost_case = _forced_case("forced.fused.left-out", gone)
    kept_case = _forced_case("forced.fused.held", held) if held is not None else None
    if lost_case is None or (held is not None and kept_case is None):
        rep.forced = Claim("forcing the fused backend", False, f"the manifest names no functional to force "
                           f"(held: {held!r}, left out: {gone!r})", where)
        return
    r = _dispatch(root, manifest, hip, cache=cache, progress=progress,
                  cases=[c for c in (kept_case, lost_case) if c is not None])
    lost = r.cases[-1]

    def fused(c) -> int:
        return sum(FUSED_FAMILY in k for k in c.kernels["bwd"])

    def seen(c, functional: dict) -> dict:
        """One forced backward as it ran: its HIP error code (None: the driver never reported it),
        its launches, the fused kernels among them, the stub's violations."""
        return {"functional": functional, "case": c.case, "backward": c.bwd, "launches": c.launches["bwd"],
                "fused_launches": fused(c), "violations": c.violations}

    ok = r.returncode == 0 and lost.bwd not in (None, HIP_SUCCESS) and fused(lost) == 0
    observed = {"driver_exit": r.returncode, "held": None, "left_out": seen(lost, gone)}
    detail = ""
    if kept_case is not None:   # every fused package left out (e.g. gfx1030 on 0.11b): no held half
        kept = r.cases[0]
        ok = ok and kept.bwd == HIP_SUCCESS and fused(kept) > 0 and not kept.violations
        observed["held"] = seen(kept, held)
        detail = f"held ({_label(held)}): backward {kept.bwd}, {fused(kept)} fused kernel launched; "
    why = f", {lost.violations[0].lstrip(': ')}" if lost.violations else ""
    rep.forced = Claim("forcing the fused backend", ok,
                       f"{detail}left out ({_label(gone)}): backward {lost.bwd} (must be an error), {fused(lost)} "
                       f"launched{why}; driver exit {r.returncode}", where, observed)


def check_rows(rep: CheckReport, root: Path, source: RowsSource) -> None:
    """The tuning-database row of every tuned launch (rows.py), one claim; none without rows."""
    tdb = source.db
    if tdb is None:
        rep.rows_note = NO_ROWS
        return
    spec = load_spec(root / SPEC).spec
    gpu = spec.primary_gpu
    rep.rows = match_report(tdb, gpu, dispatch_cases(spec), rep.dispatch.cases,
                            by_release(rep.manifest.release).image_names)
    ok, line = summary(rep.rows, gpu, every_gpu=tdb.gpus is None)
    if tdb.gpus is not None:
        where = f"CPU: emulated dispatch, rows read from the bundle's {ROWS} (the spec's GPUs' rows only)"
    else:
        where = "CPU: emulated dispatch, rows read from the applied tree's tuning database"
        if not source.carried:
            line += "; the bundle carries no rows"
        elif source.differ:
            line += f"; the tree's rows differ from those the bundle carries ({ROWS}): {'; '.join(source.differ[:4])}"
            where += f", which differ from the bundle's {ROWS}"
        else:
            line += f"; the bundle carries the same rows ({ROWS})"
            where += f", the same as the bundle's {ROWS}"
    rep.rows_claim = Claim(f"tuned kernels from the {gpu} rows of {tdb.origin}", ok, line, where)


def check_extracted(root: Path, manifest: BundleManifest, *, progress: Callable[[str], None] = lambda s: None,
                    controls: bool = True, name: str = "", tree: Path | None = None,
                    rows: RowsSource | None = None, execute: bool = False) -> CheckReport:
    """Check an extracted bundle folder (also what `bundle build` runs before it writes the file).
    `tree`: the applied tree it was built from, for the tuning-row check; without it the rows the
    bundle carries are read (`rows`: read already). `execute`: item 6 of the module doc too."""
    if rows is None:   # a bad tree or bad carried rows: refused before the work
        carried = root / ROWS
        rows = read_rows(tree=tree, carried=carried.read_bytes() if carried.is_file() else None,
                         name=f"{name or root}: {ROWS}")
    hip = manifest.hip_major
    cache = user_cache_dir("bundle-check")
    rep = CheckReport(name or str(root), manifest)
    sysroot = ensure_sysroot(hip, progress=progress)
    nodes = set(read_dynamic(sysroot.runtime).version_defs)
    rep.claims = bundle_verdict(root, manifest, nodes)
    if refused(rep.claims):   # refused as install refuses it: nothing more is run
        progress("the bundle's verdict fails (the claims below): no emulated dispatch")
        return rep
    spec = load_spec(root / SPEC).spec
    progress(f"emulated dispatch: {manifest.arch} ({spec.target_string}), "
             f"stub HIP {hip}")
    cases = check_cases(spec)   # what is dispatched is what coverage judges
    rep.dispatch = _dispatch(root, manifest, hip, cache=cache, progress=progress, cases=cases)
    reach = manifest.built_with.reach if manifest.built_with else None
    rep.coverage = coverage(spec, cases, rep.dispatch,
                            (root / manifest.library.file).read_bytes(), manifest.arch,
                            list(reach.left_out) if reach else [])
    check_rows(rep, root, rows)
    check_forced(rep, root, manifest, hip, cache, progress)
    if execute:
        rep.executed = execute_extracted(root, manifest, progress=progress)
    if not controls:
        return rep
    # 1. a missing image: remove the container (an .aks2 package, or 0.13b: the member of an image
    # zip) of the first kernel the cases launched
    used = [k for c in rep.dispatch.cases for k in c.kernels["fwd"] if k in rep.dispatch.containers]
    with tempfile.TemporaryDirectory(prefix="mi100-control-") as td:
        copy = Path(td) / "b"
        shutil.copytree(root, copy, symlinks=True)
        gone = rep.dispatch.containers[used[0]] if used else None
        if gone:
            remove_image(copy / "lib" / IMAGES_DIR, gone)
        r = _dispatch(copy, manifest, hip, cache=cache, progress=progress)
        rep.controls.append(Claim("negative control: a missing image", bool(used) and not r.ok,
                                  (f"without {gone}: {r.summary()['cases_ok']} of "
                                   f"{len(r.cases)} cases pass (must fail)") if used else "no kernel was launched",
                                  "CPU: emulated dispatch"))
    other = next(a for a in AMDGPU_MACH if a != manifest.arch and a in ("gfx90a", "gfx908"))
    r = _dispatch(root, manifest, hip, mach_arch=other, cache=cache, progress=progress)
    rep.controls.append(Claim("negative control: a code object of another arch", not r.ok and r.loads == 0,
                              f"device mach set to {other}'s: {r.loads} code objects accepted, "
                              f"{r.summary()['cases_ok']} of {len(r.cases)} cases pass (must fail)",
                              "CPU: emulated dispatch"))
    other_major = next(m for m in sorted(HIP_SOURCES, reverse=True) if m != hip)
    r = _dispatch(root, manifest, hip, stub_major=other_major, cache=cache, progress=progress)
    rep.controls.append(Claim("negative control: a library linked against another HIP major", not r.ok,
                              f"against the HIP {other_major} stub (libamdhip64.so.{other_major}): exit "
                              f"{r.returncode}, {r.stderr_tail.splitlines()[-1] if r.stderr_tail else 'no message'}",
                              "CPU: emulated dispatch"))
    return rep


def check_bundle(path: Path, *, progress: Callable[[str], None] = lambda s: None,
                 tree: Path | None = None, execute: bool = False) -> CheckReport:
    tdb = tree_database(Path(tree)) if tree is not None else None   # a bad tree: refused first
    return check_opened(open_bundle(path), progress=progress, tree_db=tdb, execute=execute)


def check_opened(b: Bundle, *, progress: Callable[[str], None] = lambda s: None,
                 tree_db: TuningDatabase | None = None, execute: bool = False) -> CheckReport:
    """`check_bundle` of a bundle already opened (`open_bundle`: every member verified), so that a
    caller which goes on to install it checks and installs the same bytes, read once."""
    rows = read_rows(tree_db=tree_db, carried=b.members.get(ROWS), name=f"{b.path}: {ROWS}")   # then bad rows
    with tempfile.TemporaryDirectory(prefix="mi100-bundle-") as td:
        root = extract(b, Path(td) / "bundle")
        return check_extracted(root, b.manifest, progress=progress, name=str(b.path), rows=rows, execute=execute)

