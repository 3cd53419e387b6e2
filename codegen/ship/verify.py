"""`bundle verify FILE --rebuild N`: a downloaded bundle checked without a signing key, by
rebuilding part of it from what it records.

The bundle says which AOTriton release, spec and Triton version made its kernels (the manifest's
`release`, its `spec.yaml` member and `built_with.toolchain.triton`; with `built_with.kernels`,
whether the build left out what dispatch never selects). In a temporary folder, and nowhere else:

1. the bundle is read by its one reader (every member checked against the manifest) and
   unpacked below the folder (contained);
2. a pristine tree of the release (`codegen.upstream.trees`) gets the bundle's spec applied
   (`apply`, as the builder did) and the tree's own generator plans its kernels with the build venv
   of the recorded Triton (`plan`, in the bundle's `--kernels` mode);
3. every kernel the plan lists is looked up where the runtime finds it in the bundle's images
   (`codegen.formats.compile_list.image_refs`); a planned kernel the bundle lacks, or a packed one
   the plan does not list, is a finding;
4. N kernels sampled per family, dtype and head dim (`codegen.compile.sample`, `--seed`) are
   compiled by the compile engine precompile uses, never from the kernel cache (a cache is no
   witness), and each compared with the bundle's code object by what a GPU loads of it
   (`codegen.formats.elf.loaded_sections`: the header's target, `.text`, `.rodata`, the AMDGPU
   metadata note, …; not the debug sections, which name the folders it was compiled in):
   `same`, `differs` (which sections), `missing`, or `failed` (it did not compile here).

What it proves: the sampled kernels are what the recorded release, spec and Triton compile to,
and the bundle packs exactly the kernels they plan. Not the kernels left unsampled, the host
library, nor a toolchain that was itself compromised (docs/trust.md)."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version
from rich.console import Console

from codegen.apply.engine import apply_overlay
from codegen.compile import engine
from codegen.compile.sample import stratified_sample
from codegen.core import ui
from codegen.core.errors import EXIT_UPSTREAM, CodegenError, UserError
from codegen.core.fsutil import sha256_file
from codegen.core.ui import printable
from codegen.formats.aks2 import KernelRef, ZipRef, package_images, packed_kernels
from codegen.formats.bundle_zip import Bundle, BundleError, extract, open_bundle
from codegen.formats.compile_list import image_refs
from codegen.formats.elf import ElfError, loaded_sections
from codegen.formats.spec import LoadedSpec, load_spec
from codegen.models.kernel import KernelEntry
from codegen.plan.run import PlanOptions, run_plan
from codegen.render.workspace import COMPILE_REPORT, overlay_results
from codegen.toolchain import generator_requirements
from codegen.toolchain.interpreter import CompilerPython, compiler_python
from codegen.upstream import detect
from codegen.upstream.releases import IMAGES_DIR
from codegen.upstream.trees import release_tree

VERDICTS = ("same", "differs", "missing", "failed")
_VERSION_RE = re.compile(r"[0-9][0-9A-Za-z.+]{0,63}")
LIST_LIMIT = 20   # names of unplanned / unpacked kernels kept in the report


class BundleDiffers(CodegenError):
    """A bundle that is not what its recorded inputs build (exit 3)."""

    exit_code = EXIT_UPSTREAM


@dataclass(frozen=True)
class VerifyOptions:
    bundle: Path
    rebuild: int                 # kernels to recompile
    seed: int = 0
    jobs: int = 0                # 0: one per usable CPU
    timeout: float = 600.0       # seconds per kernel compile
    python: str | None = None    # None: the build venv of the recorded Triton


@dataclass(frozen=True)
class KernelVerdict:
    kernel: str                  # the image name (the compile list's, as the package names it)
    config: str                  # its procedural config name
    package: str                 # the package (or image zip) below aotriton.images/ it is in
    entry: str                   # its name there (0.13b+: in the zip member its cluster is)
    verdict: str                 # one of VERDICTS
    sections: tuple[str, ...] = ()   # differs: the loaded sections that differ
    detail: str = ""

    def as_json(self) -> dict:
        return {**asdict(self), "sections": list(self.sections)}


@dataclass
class VerifyReport:
    bundle: str
    release: str
    arch: str
    triton: str
    spec: str
    kernels_mode: str
    tree_from: str = ""
    planned: int = 0
    packed: int = 0
    not_packed: list[str] = field(default_factory=list)    # planned kernels the bundle lacks
    not_planned: list[str] = field(default_factory=list)   # packed kernels the plan does not list
    seed: int = 0
    kernels: list[KernelVerdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def count(self, verdict: str) -> int:
        return sum(k.verdict == verdict for k in self.kernels)

    @property
    def ok(self) -> bool:
        return bool(self.kernels) and self.count("same") == len(self.kernels) and not self.not_packed \
            and not self.not_planned

    def as_json(self) -> dict:
        return {"bundle": self.bundle, "release": self.release, "arch": self.arch, "triton": self.triton,
                "spec": self.spec, "kernels_mode": self.kernels_mode, "tree_from": self.tree_from,
                "planned": self.planned, "packed": self.packed,
                "not_packed": {"count": len(self.not_packed), "kernels": self.not_packed[:LIST_LIMIT]},
                "not_planned": {"count": len(self.not_planned), "kernels": self.not_planned[:LIST_LIMIT]},
                "seed": self.seed, "sampled": len(self.kernels), "kernels": [k.as_json() for k in self.kernels],
                "summary": {v: self.count(v) for v in VERDICTS}, "notes": self.notes, "ok": self.ok,
                "seconds": self.seconds}


def compare_code_objects(rebuilt: bytes, packed: bytes) -> tuple[str, ...]:
    """The loaded sections (`codegen.formats.elf.loaded_sections`) in which a packed code object
    differs from the one rebuilt: () when the GPU would load the same bytes. A packed image that is
    not a readable code object differs as a whole (`not a code object`)."""
    want = loaded_sections(rebuilt, "the rebuilt code object")
    try:
        got = loaded_sections(packed, "the packed code object")
    except ElfError:
        return ("not a code object",)
    return tuple([n for n in want if want[n] != got.get(n)] + sorted(n for n in got if n not in want))


def recorded_triton(bundle: Bundle) -> str:
    """The Triton version the bundle's kernels were compiled with, as its manifest records it."""
    m = bundle.manifest
    version = (m.built_with.toolchain.get("triton") if m.built_with is not None else None) or ""
    if not version:
        raise BundleError(f"{bundle.path}: its manifest records no Triton version (built_with.toolchain.triton): "
                          "nothing to rebuild its kernels with", hint="a bundle made by an older mi100-codegen: "
                          "build it again with `mi100-codegen bundle build TREE --hip N`")
    try:   # it becomes a pip requirement: a version and nothing else
        if not _VERSION_RE.fullmatch(version) or str(Version(version)) != version:
            raise InvalidVersion(version)
    except InvalidVersion:
        raise BundleError(f"{bundle.path}: its manifest's Triton version {printable(version[:80])!r} is not a "
                          "version") from None
    return version


def _bundle_spec(bundle: Bundle, root: Path, work: Path) -> LoadedSpec:
    """The bundle's spec, copied alone into a folder of its own (its results are then the ones this
    install ships, never files the bundle carries), checked against what the manifest says of it."""
    m = bundle.manifest
    home = work / "spec"
    home.mkdir()
    path = shutil.copy2(root / m.spec.file, home / "spec.yaml") if m.spec.file else None
    if path is None:
        raise BundleError(f"{bundle.path}: its manifest names no spec file: nothing to rebuild from")
    try:
        loaded = load_spec(Path(path))
    except CodegenError as exc:
        raise BundleError(f"{bundle.path}: the spec it carries is not a valid spec:\n{exc}") from None
    if loaded.sha256 != m.spec.sha256 or loaded.spec.arch != m.arch:
        raise BundleError(f"{bundle.path}: the spec it carries is not the one its manifest names (sha256 "
                          f"{loaded.sha256[:12]}…, arch {loaded.spec.arch}; the manifest: {m.spec.sha256[:12]}…, "
                          f"arch {m.arch})")
    return loaded


def _compile_report_note(bundle: Bundle, loaded: LoadedSpec) -> list[str]:
    """A note when this install renders the spec with another compile report than the builder's."""
    summary = bundle.manifest.compile_report
    path = overlay_results(loaded).get(COMPILE_REPORT)
    if summary is None or path is None:
        return []
    if sha256_file(path) == summary.sha256:
        return []
    return [f"this mi100-codegen renders the spec with another compile report than the bundle's builder "
            f"({summary.sha256[:12]}…): a kernel it plans differently shows as not packed or not planned"]


def _plan(tree: Path, mode: str, compiler: CompilerPython, build: Path, err: Console
          ) -> tuple[list[KernelEntry], dict[str, KernelRef | ZipRef]]:
    """The kernels the tree's generator plans (in the bundle's mode) and where each lies in the images."""
    run = run_plan(PlanOptions(tree, None, compiler.python, kernels=mode, build_dir=build), console=err)
    refs = image_refs(build)
    return run.entries, {e.id: refs[e.hsaco] for e in run.entries if e.hsaco in refs}


def _compiler(loaded: LoadedSpec, tree: Path, triton: str, python: str | None, err: Console) -> CompilerPython:
    """The build venv of the recorded Triton (made on first use), or `python` when its Triton is that one."""
    compiler = compiler_python(loaded.spec, "bundle verify", python=python, triton=None if python else triton,
                               requirements=generator_requirements(tree), console=err, same_python=True)
    if compiler.triton != triton:
        raise UserError(f"--python {python} has Triton {compiler.triton}; the bundle's kernels were compiled with "
                        f"Triton {triton}", hint="leave out --python: verify makes a build venv of that version")
    err.print(f"compiler: {compiler.describe()}", markup=False)
    return compiler


def _rebuild(tree: Path, todo: list[KernelEntry], loaded: LoadedSpec, opts: VerifyOptions, compiler: CompilerPython,
             objects: Path, err: Console) -> dict[str, tuple[bytes | None, str]]:
    """Compile `todo` without the kernel cache: {kernel: (its code object or None, the error)}."""
    if not todo:
        return {}
    jobs = min(opts.jobs or engine.default_jobs(), len(todo))
    with ui.progress(err, detail="{task.fields[status]}") as progress:
        bar = progress.add_task("rebuild", total=len(todo), status="")

        def tick(r) -> None:
            progress.update(bar, advance=1, status=f"{r.config} {r.status}")

        run = engine.compile_entries(tree, todo, loaded.spec, jobs=jobs, timeout_s=opts.timeout, cache=None,
                                     keep=objects, on_progress=tick, compiler=compiler)
    out = {}
    for e, r in zip(todo, run.results):
        image = objects / e.hsaco
        out[e.id] = (image.read_bytes() if r.status == "ok" and image.is_file() else None, r.error or r.status)
    return out


def _verdicts(chosen: list[KernelEntry], where: dict, packed: dict, rebuilt: dict, images: Path
              ) -> list[KernelVerdict]:
    """Each sampled kernel against the bundle's code object at the place the runtime looks for it."""
    stored: dict = {}
    for f in sorted({where[e.id].file for e in chosen if where.get(e.id) in packed}):
        stored.update(package_images(images, f))
    out = []
    for e in chosen:
        ref = where.get(e.id)
        found = (ref.file, ref.name) if ref is not None else ("(no package in the plan's lists)", "")
        image = stored.get(ref) if ref is not None else None
        if not image:
            out.append(KernelVerdict(e.id, e.config.name, *found, "missing",
                                     detail="not packed" if ref not in packed else "packed empty"))
            continue
        data, error = rebuilt[e.id]
        if data is None:
            out.append(KernelVerdict(e.id, e.config.name, *found, "failed", detail=f"does not compile here: {error}"))
            continue
        differ = compare_code_objects(data, image)
        out.append(KernelVerdict(e.id, e.config.name, *found, "differs" if differ else "same", differ))
    return out


def _inventory(rep: VerifyReport, entries: list[KernelEntry], where: dict, packed: dict) -> None:
    """Planned against packed, every kernel (names only)."""
    planned = {where[e.id] for e in entries if e.id in where}
    rep.planned, rep.packed = len(entries), len(packed)
    rep.not_packed = sorted(e.id for e in entries if where.get(e.id) not in packed)
    rep.not_planned = sorted(f"{r.file}: {r.name}" for r in packed if r not in planned)


def verify_bundle(opts: VerifyOptions, err: Console | None = None) -> VerifyReport:
    """Rebuild `opts.rebuild` sampled kernels of a bundle from what it records (see the module doc)."""
    err = err or ui.console()
    if opts.rebuild < 1:
        raise UserError(f"--rebuild {opts.rebuild}: rebuild at least one kernel")
    clock = [time.monotonic()]

    def lap(name: str) -> None:
        clock.append(time.monotonic())
        rep.seconds[name] = round(clock[-1] - clock[-2], 1)

    bundle = open_bundle(opts.bundle)
    m = bundle.manifest
    triton = recorded_triton(bundle)
    mode = (m.built_with.kernels if m.built_with is not None else None) or "all"
    rep = VerifyReport(bundle=str(opts.bundle), release=m.release, arch=m.arch, triton=triton,
                       spec=m.spec.name or m.spec.sha256[:12], kernels_mode=mode, seed=opts.seed)
    with tempfile.TemporaryDirectory(prefix="mi100-codegen-verify-") as tmp:
        work = Path(tmp)
        root = extract(bundle, work / "bundle")
        loaded = _bundle_spec(bundle, root, work)
        rep.notes += _compile_report_note(bundle, loaded)
        tree = work / "tree"
        rep.tree_from = release_tree(m.release, tree)
        err.print(f"AOTriton {m.release} from {rep.tree_from}: applying the bundle's spec", markup=False)
        apply_overlay(tree, loaded, release=detect(tree))
        compiler = _compiler(loaded, tree, triton, opts.python, err)
        lap("tree")
        entries, where = _plan(tree, mode, compiler, work / "build" / "v3src", err)
        images = root / "lib" / IMAGES_DIR
        packed = packed_kernels(images)
        _inventory(rep, entries, where, packed)
        chosen = stratified_sample(entries, opts.rebuild, opts.seed)
        lap("plan")
        todo = [e for e in chosen if where.get(e.id) in packed]
        err.print(f"rebuilding {len(todo)} of {len(entries)} planned kernels (seed {opts.seed}), no kernel cache",
                  markup=False)
        rebuilt = _rebuild(tree, todo, loaded, opts, compiler, work / "objects", err)
        lap("compile")
        rep.kernels = _verdicts(chosen, where, packed, rebuilt, images)
        lap("compare")
    rep.seconds["total"] = round(clock[-1] - clock[0], 1)
    return rep
