"""`torch install --bundle auto`: the owner's one command. Plan first, then act:

1. **Plan** (`plan_owner`): detect the card and the torch (codegen.ship.detect; a torch no bundle
   fits, an unsupported card or several archs without --arch: one message, exit 2), the spec (your
   `--spec`, else the shipped one of the card's family), the AOTriton release to build for the
   torch's line and its HIP major, and where the bundle comes from: the index's entry for (release
   line, arch, HIP major) (codegen.ship.index), or a build here when the index has none, cannot be
   reached, `--build-locally` is given, or the published bundle cannot carry what you asked for
   (a spec of yours, tuning results of yours for the shipped spec).
2. **The bundle**: downloaded (codegen.ship.fetch: resumable, bounded by the index's size, its
   sha256 checked before the file is opened) into the user cache, then what the index's entry
   says of it compared with its own manifest (codegen.ship.index.entry_differences); or built here:
   a pristine tree of the release (`AOTRITON_SRC`, `AOTRITON_GIT`, the release archive, else `git
   clone` over HTTPS), the spec applied, `bundle build` with the time the cost table
   (codegen.imagebuild.cost) gives; every part resumable after an interruption (the tree and
   its build folder stay, compiled kernels stay in the kernel cache).
3. **bundle check** (codegen.ship.check) on a downloaded bundle (a bundle built here was checked by
   its build); where this machine cannot run its emulated dispatch (no HIP sysroot can be made: not
   Debian, or offline), said, and the install's own checks still run.
4. **The install** (codegen.ship.install.install_into, the one torch install: backup and one
   journaled transaction; what an interrupted install or restore left is finished first).
5. **validate** on a machine with the card, in a child process (a fresh `import torch`) the
   command line starts (`OwnerOptions.validator`: ship runs no command of the CLI); a failure
   restores torch as it was. Then the `report` command to send.

Nothing of torch is touched before step 4, so any failure before it leaves torch as it was; a
failure in step 5 restores it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.console import Console

from codegen.apply.engine import apply_overlay
from codegen.core import processes, ui
from codegen.core.errors import CodegenError, EXIT_UPSTREAM, EnvironmentMissing, UpstreamError, UserError
from codegen.core.fsutil import trusted_storage
from codegen.core.resources import user_cache_dir
from codegen.formats.bundle_zip import BUNDLE_LIMIT, Bundle, bundle_name, open_bundle
from codegen.formats.elf import version_key
from codegen.formats.spec import LoadedSpec, load_spec
from codegen.imagebuild.cost import build_cost, estimate_s
from codegen.imagebuild.run import cpu_count
from codegen.models.archs import HSA_OVERRIDE_ENV
from codegen.models.machine import Machine
from codegen.models.index import INDEX_LIMIT, IndexEntry
from codegen.render.workspace import RENDER_INPUTS, is_shipped, results_dir
from codegen.ship.bundle import BundleBuildError, KernelBuild, build_bundle
from codegen.ship.check import check_opened
from codegen.ship.detect import SYSFS, DetectOptions, detect_machine, family_of, has_gpu
from codegen.ship.fetch import NetworkError, Wanted, fetch, fetch_bytes
from codegen.ship.index import (entry_differences, index_location, index_source, read_index, read_index_file,
                                select_bundle)
from codegen.ship.install import (backup_location, bundle_prefix, install_into, machine_glibc, restore_torch,
                                  unfinished)
from codegen.ship.layout import TorchInstall, inspect_torch
from codegen.upstream.releases import by_release
from codegen.upstream.trees import release_tree

AOTRITON_URL = "https://github.com/ROCm/aotriton.git"
CLONE_TIMEOUT_S = 1800.0
VALIDATE_TIMEOUT_S = 3600.0


class ValidateFailed(CodegenError):
    """validate failed on the card after the install; torch was restored (exit 3)."""

    exit_code = EXIT_UPSTREAM


@dataclass(frozen=True)
class ValidateRun:
    """What validate runs against after the install: the spec, the folder its reports go to
    (validate.json, validate.md), the environment of the child process and its time limit."""

    spec: Path
    out: Path
    env: dict[str, str]
    timeout_s: float


@dataclass(frozen=True)
class OwnerOptions:
    torch_dir: Path | None = None
    backup_dir: Path | None = None
    arch: str | None = None
    spec: Path | None = None
    index: str | None = None          # a folder or a URL (else $MI100_CODEGEN_INDEX, else the published one)
    build_locally: bool = False
    dry_run: bool = False
    jobs: int | None = None
    sysfs: Path = SYSFS
    validator: Callable[[ValidateRun], int] | None = None   # validate in a fresh process: its exit status
    replace_shipped: str | None = None   # the arch whose kernels torch already holds may be replaced


@dataclass
class OwnerPlan:
    torch: TorchInstall
    machine: Machine
    loaded: LoadedSpec
    arch: str                         # the bundle's arch (the family's)
    release: str                      # the bundle's release: the index entry's, or the one a build here builds
    hip: int
    wanted: Wanted | None = None      # the index's bundle; None: built here
    entry: IndexEntry | None = None   # what the index says of it
    local_why: str | None = None      # why it is built here
    index_failed: str | None = None   # why the index could not be read (the build here says it when it fails)
    validate: str | None = None       # None: validate runs after the install; else why it does not
    notes: list[str] = field(default_factory=list)


# --- plan ----------------------------------------------------------------------------------------
def _refuse_machine(machine: Machine) -> None:
    card, facts = machine.card, machine.torch
    if facts is not None and facts.problem:
        raise UserError(facts.problem)
    if card is None:
        raise EnvironmentMissing("no AMD GPU found: " + "; ".join(machine.notes),
                                 hint="to prepare the install for a card this machine does not hold, name it: --arch gfx908")
    if card.problem:
        raise UserError(card.problem, hint="pick one with --arch ARCH" if "--arch" in card.problem else None)


def _spec(opts: OwnerOptions, machine: Machine) -> LoadedSpec:
    """`--spec`, which must target the card's family's arch; else the family's shipped spec."""
    family = machine.card.family
    if opts.spec is None:
        return load_spec(Path(family.path))
    loaded = load_spec(opts.spec)
    if loaded.spec.arch != family.arch:
        raise UserError(f"--spec {loaded.display} targets {loaded.spec.arch}; the card is served by {family.arch} "
                        f"({family.spec}: {family.spec_file})")
    return loaded


def _own_results(loaded: LoadedSpec) -> list[Path]:
    """Tuning results of yours that render reads for a shipped spec (a published bundle lacks them)."""
    d = results_dir(loaded)
    return [d / n for n in RENDER_INPUTS if (d / n).is_file()] if is_shipped(loaded.path) else []


def plan_owner(opts: OwnerOptions, say: Callable[[str], None]) -> OwnerPlan:
    """Detect, refuse what no bundle can serve, choose the spec, the release and the source (module doc)."""
    torch = inspect_torch(opts.torch_dir)
    machine = detect_machine(torch, DetectOptions(opts.arch, opts.sysfs, ask_torch=opts.torch_dir is None
                                                  and torch.is_rocm))
    _refuse_machine(machine)
    facts = machine.torch
    loaded = _spec(opts, machine)
    plan = OwnerPlan(torch, machine, loaded, machine.card.family.arch, facts.build_release, facts.hip_major)
    plan.notes += list(loaded.warnings)
    plan.validate = _no_validate(plan, opts.validator)
    others = sorted({g.arch for g in machine.gpus if g.devices and family_of(g.arch) != machine.card.family})
    if others:
        plan.notes.append(f"this machine also has {', '.join(others)}: the bundle's library dispatches for "
                          f"{plan.arch} only, so flash attention there goes")
    own = _own_results(loaded)
    if opts.build_locally:
        plan.local_why = "--build-locally"
    elif own:
        plan.local_why = f"your tuning results ({own[0]}): published bundles do not carry them"
    else:
        _choose_published(plan, opts, say)
    return plan


_CHILD_TORCH = ("import importlib.util as u\ns = u.find_spec('torch')\n"
                "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')\n")


def _no_validate(plan: OwnerPlan, validator) -> str | None:
    """Why validate cannot run after the install (None: it can): no such card here, or the torch
    installed into is not the one a child of this Python imports (validate would test another)."""
    if not has_gpu(plan.machine):
        return "no such card in this machine: validate on the card's machine"
    if validator is None:
        return "no validate step was given: run mi100-codegen validate"
    try:
        r = processes.run([sys.executable, "-c", _CHILD_TORCH], timeout=60, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
        child = Path(r.stdout.strip()).resolve() if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        child = None
    if child != plan.torch.root:
        return (f"this Python imports {child or 'no torch'}, not {plan.torch.root}: run validate with the Python "
                "whose torch this is")
    return None


def _choose_published(plan: OwnerPlan, opts: OwnerOptions, say: Callable[[str], None]) -> None:
    """The index's bundle for the plan, or why there is none (plan.local_why)."""
    source, origin = index_source(opts.index)
    loc = index_location(source, origin)
    say(f"reading the index {loc.document} ({origin})")
    try:
        if loc.is_url:
            index = read_index(fetch_bytes(loc.document, limit=INDEX_LIMIT, step="reading the bundle index"),
                               loc.document)
        elif not os.path.lexists(loc.document):
            raise UserError(f"{origin} {source}: no index.json there",
                            hint="write one: mi100-codegen bundle index DIR")
        else:
            index = read_index_file(Path(loc.document))
    except NetworkError as exc:
        plan.index_failed = str(exc)
        plan.local_why = f"the index cannot be read ({exc})"
        return
    facts = plan.machine.torch
    e = select_bundle(index, release=facts.release_tag, arch=plan.arch, hip_major=plan.hip).entry
    if e is None:
        plan.local_why = (f"the index has no bundle of the AOTriton {facts.release_line} line for {plan.arch}, "
                          f"HIP {plan.hip}")
        return
    if e.spec.sha256 != plan.loaded.sha256:
        theirs = f"spec {e.spec.name or '?'} (sha256 {e.spec.sha256[:12]}…)"
        if opts.spec is not None:   # a spec you named: only a bundle built from it will do
            plan.local_why = f"the index's bundle was built from {theirs}, not --spec {plan.loaded.display}"
            return
        plan.notes.append(f"the index's bundle was built from {theirs}, this mi100-codegen's {plan.loaded.display} "
                          f"is sha256 {plan.loaded.sha256[:12]}…")
    have = machine_glibc()
    if e.glibc and have and version_key(have) < version_key(e.glibc):
        plan.local_why = f"the index's bundle needs {e.glibc}, this machine has {have}"
        return
    if e.size > BUNDLE_LIMIT:
        raise UserError(f"{loc.document}: {e.file} is {e.size:,} bytes by the index, more than a bundle may be "
                        f"({BUNDLE_LIMIT:,}); nothing fetched")
    plan.wanted, plan.entry, plan.release = Wanted(loc.bundle(e), e.file, e.size, e.sha256), e, e.release


def describe(plan: OwnerPlan) -> list[str]:
    """The plan as printed: card, torch, release, HIP major, spec, where the bundle comes from."""
    m, f = plan.machine, plan.machine.torch
    card = m.card
    gpu = next((g for g in m.gpus if g.arch == card.arch), None)
    found = f"{gpu.devices} device(s), {gpu.source}" if gpu and gpu.devices else "not in this machine: --arch"
    lines = [f"card:     {card.arch} ({found})"]
    if card.override:
        lines.append(f"          runs {plan.arch}'s kernels with {HSA_OVERRIDE_ENV}={card.override}: "
                     + ("set here" if card.override_ok else "NOT set here: export it before you use torch"))
    lines += [
        f"torch:    {f.version} ({f.torch_dir}), links AOTriton {f.release_tag} ({f.aotriton_file})",
        f"release:  AOTriton {plan.release} " + ("(the release torch links)" if plan.release == f.release_tag else
                                                  f"(line {f.release_line}: ABI-compatible with the {f.release_tag} torch links)"),
        f"HIP:      {plan.hip} ({f.hip_source})",
        f"spec:     {plan.loaded.spec.name} ({plan.loaded.display}, sha256 {plan.loaded.sha256[:12]}…)",
    ]
    if plan.wanted is not None:
        w = plan.wanted
        size = f"{w.size / 1e6:.1f} MB" if w.size >= 100_000 else f"{w.size / 1e3:.1f} kB"
        lines.append(f"bundle:   {w.name} from the index ({size}, sha256 {w.sha256[:16]}…)")
        lines.append(f"          {w.source}")
    else:
        lines.append(f"bundle:   {bundle_name(plan.release, plan.arch, plan.hip)}, built here: {plan.local_why}")
        lines.append(f"          {_estimate(plan)}")
    lines.append(f"then:     bundle check, install into {f.torch_dir}, "
                 + ("validate on the card" if plan.validate is None else f"no validate ({plan.validate})"))
    return lines + [f"note:     {n}" for n in plan.notes]


def _estimate(plan: OwnerPlan) -> str:
    cost = build_cost(plan.release, plan.loaded.spec.name)
    if cost is None:
        return f"time: no measured cost for spec {plan.loaded.spec.name} (the cost table has the shipped specs)"
    cores = cpu_count()
    mins = estimate_s(cost, cores) / 60
    return (f"time: about {mins:.0f} min on this machine's {cores} core(s) from an empty kernel cache "
            f"({cost.kernels:,} kernels, {cost.cpu_s:,} CPU-s measured for {cost.release} {cost.spec}); "
            "kernels already in the cache are not compiled again")


# --- act -----------------------------------------------------------------------------------------
_CACHE_FIX = "or point $MI100_CODEGEN_CACHE at a cache folder of your own"


def owner_cache(sub: str) -> Path:
    """The folder `sub` (`downloads`, `trees`, `built`, `validate`) of the owner's cache
    (`user_cache_dir('owner')`), created where missing. Trusted storage, as the kernel cache is
    (codegen.core.fsutil.trusted_storage): a bundle found in `built/` is installed without
    `bundle check` and a tree in `trees/` runs its generator, so the cache folder and `sub` must
    be no link, this user's, and writable by no one else; else UntrustedStorage (exit 2) with the
    fix, before anything in them is read."""
    root = user_cache_dir("owner")
    for folder in (root, root / sub):
        try:
            folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{folder}: cannot create this cache folder ({exc.strerror or exc})",
                            hint=_CACHE_FIX.removeprefix("or ")) from None
        trusted_storage(folder, what="cache folder of torch install --bundle auto", hint=_CACHE_FIX)
    return root / sub


def obtain_bundle(plan: OwnerPlan, opts: OwnerOptions, console: Console, say: Callable[[str], None]) -> tuple[Bundle, bool]:
    """The bundle, opened (every member verified: what is checked and installed after, read once),
    and whether it was built (and so checked) here."""
    if plan.wanted is None:
        try:
            return build_here(plan, opts, console, say), True
        except CodegenError as exc:
            if plan.index_failed:   # the build was the fallback: its failure says why it ran
                exc.message += f" (the bundle was built here because the index cannot be read: {plan.index_failed})"
            raise
    path = _download(plan.wanted, console)
    bundle = open_bundle(path)
    lies = entry_differences(bundle, plan.entry)
    if lies:   # the file is the one the index names, but not what the index says it is
        path.unlink()
        raise UserError(f"{path.name}: the index's entry does not describe the bundle it names: " + "; ".join(lies[:3])
                        + (f" (and {len(lies) - 3} more)" if len(lies) > 3 else "") + "; deleted, torch untouched",
                        hint="the index was changed or not written by `mi100-codegen bundle index DIR`: use another "
                             "(--index), or --build-locally")
    return bundle, False


def _download(want: Wanted, console: Console) -> Path:
    with ui.progress(console, data=True, remaining=True) as bar:
        task = bar.add_task(f"downloading {want.name}", total=want.size)
        return fetch(want, owner_cache("downloads"), step=f"downloading {want.name}",
                     on_bytes=lambda done, total: bar.update(task, completed=done))


def _clone(release: str, dest: Path) -> str | None:
    """A shallow clone of the release's tag over HTTPS, checked to be the tag's recorded commit."""
    record = by_release(release)
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    try:
        r = processes.run(["git", "clone", "--quiet", "--depth", "1", "--branch", release, "--single-branch",
                           AOTRITON_URL, str(dest)], timeout=CLONE_TIMEOUT_S, capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise EnvironmentMissing(f"fetching AOTriton {release}: git is not installed",
                                 hint="install git, or set AOTRITON_SRC to an extracted tree of the release") from None
    except subprocess.TimeoutExpired:
        raise NetworkError(f"fetching AOTriton {release} (git clone {AOTRITON_URL})",
                           f"did not finish within {CLONE_TIMEOUT_S / 60:g} min") from None
    if r.returncode:
        tail = (r.stderr or "").strip().splitlines()
        raise NetworkError(f"fetching AOTriton {release} (git clone {AOTRITON_URL})",
                           f"{ui.printable(tail[-1]) if tail else f'git exited {r.returncode}'}: this step needs the network",
                           hint="set AOTRITON_SRC to an extracted tree of the release, or AOTRITON_GIT to a git dir "
                                "of ROCm/aotriton, then run the same command again")
    head = processes.run(["git", "-C", str(dest), "rev-parse", "HEAD"], timeout=60, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL).stdout.strip()
    if head != record.commit:
        raise UpstreamError(f"{AOTRITON_URL} tag {release} is commit {head[:12]}, not {record.commit[:12]} as "
                            "mi100-codegen records it: refusing a moved tag")
    return f"git clone {AOTRITON_URL} ({release} at {head[:12]})"


def _tree(plan: OwnerPlan, say: Callable[[str], None]) -> Path:
    """The applied tree of the plan's release and spec under the cache (made once, kept)."""
    root = owner_cache("trees")
    tree = root / f"aotriton-{plan.release}-{plan.loaded.spec.name}-{plan.loaded.sha256[:12]}"
    if os.path.lexists(tree):
        trusted_storage(tree, what="AOTriton tree made here earlier", hint=_CACHE_FIX)   # its generator runs
    if not tree.is_dir():
        say(f"fetching AOTriton {plan.release}")
        where = release_tree(plan.release, tree, fetch=_clone)
        say(f"AOTriton {plan.release} from {where}: {tree}")
    say(f"applying {plan.loaded.display} to {tree}")
    apply_overlay(tree, plan.loaded, progress=lambda m: None)
    return tree


def build_here(plan: OwnerPlan, opts: OwnerOptions, console: Console, say: Callable[[str], None]) -> Bundle:
    """The bundle built in the user cache (module doc, step 2), opened; reused when an earlier run
    built it from the same spec."""
    out = owner_cache("built")
    done = out / bundle_name(plan.release, plan.arch, plan.hip)
    if os.path.lexists(done):
        trusted_storage(done, what="bundle built here earlier", hint=_CACHE_FIX)   # it is installed unchecked
    if done.is_file():
        try:
            earlier = open_bundle(done)
            if earlier.manifest.spec.sha256 == plan.loaded.sha256:
                say(f"using the bundle built here earlier: {done}")
                return earlier
        except UserError:
            pass
        done.unlink()
    tree = _tree(plan, say)
    adapter = by_release(plan.release)
    say(f"building the bundle: {_estimate(plan)}")
    res = build_bundle(tree, plan.hip, spec_path=None, out_dir=out, images=None, build_dir=None,
                       jobs=opts.jobs or cpu_count(), console=console, progress=say,
                       kernel_build=KernelBuild(show_progress=True, aiter_stand_in=adapter.clones_aiter))
    if res.path is None:
        failed = [c.name for c in res.check.claims + res.check.controls if not c.ok]
        raise BundleBuildError(f"the bundle built here fails its checks ({', '.join(failed) or 'see above'}); "
                               "no file written, torch untouched")
    return open_bundle(res.path)


def check_downloaded(bundle: Bundle, say: Callable[[str], None]) -> None:
    """`bundle check` on a downloaded bundle (module doc, step 3)."""
    path = bundle.path
    say(f"bundle check {path.name}")
    try:
        rep = check_opened(bundle, progress=say)
    except EnvironmentMissing as exc:
        say(f"bundle check: its emulated dispatch cannot run here ({exc}); the install still checks every member "
            "against the manifest and the library against torch's HIP runtime")
        return
    if not rep.ok:
        failed = [c.name for c in rep.claims + rep.controls if not c.ok] or ["emulated dispatch"]
        raise BundleBuildError(f"{path}: the bundle fails bundle check ({', '.join(failed)}); torch untouched",
                               hint=f"`mi100-codegen bundle check {path}` shows every check")
    say("bundle check: every check passed (CPU-built, dispatch emulated)")


def _validate(plan: OwnerPlan, opts: OwnerOptions, bdir: Path | None, bundle: Path, say: Callable[[str], None]) -> Path:
    """validate in a child process on the card (`opts.validator`); on failure torch is restored
    from `bdir` (None: this run installed nothing, torch stays as it was) and ValidateFailed raised."""
    out = owner_cache("validate")
    env = dict(os.environ)
    card = plan.machine.card
    if card.override and env.get(HSA_OVERRIDE_ENV) != card.override:
        env[HSA_OVERRIDE_ENV] = card.override
    say("validate (a fresh torch on the card)")
    undo = (lambda: restore_torch(plan.torch, bdir)) if bdir is not None else (lambda: None)
    try:
        code = opts.validator(ValidateRun(plan.loaded.path, out, env, VALIDATE_TIMEOUT_S))
    except BaseException:
        undo()
        raise
    if code:
        undo()
        raise ValidateFailed(
            f"validate failed on {card.arch} (exit {code}, above); torch is as it was before this command",
            hint=f"the failure is worth a report: mi100-codegen torch install --bundle {bundle}, then "
                 "mi100-codegen report (send the file), then mi100-codegen torch restore")
    return out / "validate.md"


@dataclass
class OwnerResult:
    bundle: Path
    installed: bool
    validated: bool
    summary: str


def run_owner(plan: OwnerPlan, opts: OwnerOptions, console: Console, say: Callable[[str], None]) -> OwnerResult:
    """Steps 2–5 of the module doc."""
    bundle, built_here = obtain_bundle(plan, opts, console, say)
    path = bundle.path
    if not built_here:
        check_downloaded(bundle, say)
    bdir = backup_location(plan.torch, opts.backup_dir)
    res = install_into(plan.torch, bdir, lambda work: bundle_prefix(bundle, work / "bundle", plan.torch, plan.arch),
                       replace_shipped=opts.replace_shipped)
    inst = res.plan
    for line in res.recovered.said + inst.notes:
        say(line)
    if inst.identical:
        say(f"identical: this bundle is already installed in {plan.torch.root}")
    else:
        say(f"installed: {path.name} as lib/{plan.torch.aot_needed.name} + images for {inst.arch} into "
            f"{plan.torch.root} ({inst.summary()}); backup {bdir}")
    validated = plan.validate is None
    if validated:
        _validate(plan, opts, bdir if not inst.identical else None, path, say)
    return OwnerResult(path, not inst.identical, validated, inst.summary())


def install_auto(opts: OwnerOptions, console: Console) -> OwnerResult | None:
    """The whole command: the plan printed, then (unless a dry run) steps 2–5 and what to send."""
    def say(msg: str) -> None:
        console.print(ui.printable(msg), markup=False)

    plan = plan_owner(opts, say)
    for line in describe(plan):
        say(line)
    if opts.dry_run:
        note = unfinished(plan.torch, backup_location(plan.torch, opts.backup_dir))
        if note:
            say(f"note:     {note}")
        say("dry run: nothing fetched, built or installed")
        return None
    res = run_owner(plan, opts, console, say)
    if res.validated:
        say(f"validated on {plan.machine.card.arch}. Send what happened: mi100-codegen report "
            "(writes mi100-codegen-report.md; attach it to a Card report issue)")
    else:
        say(f"validate not run ({plan.validate}). Then: mi100-codegen report (writes mi100-codegen-report.md; "
            "attach it to a Card report issue)")
    return res
