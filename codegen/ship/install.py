"""Swap our AOTriton build into an installed PyTorch, and put the original back.

Plan first, then act: `plan_install` checks everything and lists every file it would add,
replace or remove (refusals raise before anything is touched); `apply_install` backs up each
file it replaces or removes (a manifest with sha256s), then replaces files one by one with
atomic renames, and rolls back from the backup if anything fails. `restore` puts the backed-up
files back (same bytes, mode and mtime) and removes what was added.

The backup lives beside the torch package (`<site-packages>/torch.mi100-codegen-backup/`),
not inside it, so that after `restore` the torch folder is byte-identical to before.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from codegen.core.contain import inside
from codegen.core.errors import CodegenError, EXIT_UPSTREAM, UserError
from codegen.core.fsutil import atomic_copy, atomic_write, move_into_place
from codegen.formats.bundle_zip import extract, open_bundle, sha256
from codegen.formats.elf import ElfError, read_dynamic, version_key
from codegen.models.backup import BACKUP_SCHEMA, BackupManifest, BundleRecord
from codegen.models.records import RecordError, read_record, validate_record, write_json
from codegen.ship.hip import hip_mismatch, library_hip, torch_hip
from codegen.ship.layout import (
    inspect_prefix,
    IMAGES_DIR,
    PrefixInstall,
    TorchInstall,
    aotriton_namespaces,
    needed_aotriton_symbols,
    sha256_file,
)

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = BACKUP_SCHEMA
TOOL = "mi100-codegen torch install"


class InstallError(CodegenError):
    """The swap failed half-way and was rolled back (or could not be)."""

    exit_code = EXIT_UPSTREAM


def default_backup_dir(torch: TorchInstall) -> Path:
    return torch.root.parent / f"{torch.root.name}.mi100-codegen-backup"


@dataclass(frozen=True)
class Action:
    rel: str  # path relative to the torch folder, POSIX spelling
    kind: str  # "add" | "replace" | "remove"
    src: Path | None = None  # the file from the prefix (add, replace)
    sha_before: str | None = None
    sha_after: str | None = None


@dataclass
class InstallPlan:
    torch: TorchInstall
    prefix: PrefixInstall
    arch: str
    actions: list[Action]
    created_dirs: list[str]
    notes: list[str] = field(default_factory=list)
    identical: bool = False
    bundle: BundleRecord | None = None      # what the backup manifest records of an installed bundle

    def summary(self) -> str:
        counts = {k: sum(1 for a in self.actions if a.kind == k) for k in ("add", "replace", "remove")}
        return ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "nothing to do"


# --- checks --------------------------------------------------------------------------------------
def _refuse(msg: str, hint: str | None = None) -> None:
    raise UserError(msg, hint=hint)


def check_compatible(torch: TorchInstall, prefix: PrefixInstall, arch: str) -> list[str]:
    """Every refusal of `install`, as one clear error; returns notes (non-fatal) otherwise."""
    _check_rocm_torch(torch)
    _check_library(torch, prefix)
    notes: list[str] = []
    want, have = torch.aot_needed, prefix.parsed
    if have.patch != want.patch:
        notes.append(
            f"note: torch links {want.name}, the prefix holds {have.name}: point releases of one "
            f"line are ABI-compatible; installing it under the name torch links ({want.name})"
        )
    _check_symbols(torch, prefix)
    _check_images(prefix, arch)
    return notes


def _check_rocm_torch(torch: TorchInstall) -> None:
    """A ROCm torch that links AOTriton as a shared library (the only kind a swap can change)."""
    if torch.hip_lib is None or torch.hip is None:
        kind = f"a CUDA build (CUDA {torch.cuda})" if torch.cuda else "not a ROCm build"
        why = "no lib/libtorch_hip.so" if torch.hip_lib is None else "torch.version.hip is unset"
        _refuse(
            f"torch {torch.version} at {torch.root} is {kind} ({why}); AOTriton is used only by ROCm builds",
            hint="install a ROCm wheel of PyTorch (pip install torch --index-url https://download.pytorch.org/whl/rocmX.Y)",
        )
    if torch.aot_needed is None:
        _refuse(
            f"{torch.hip_lib} needs no libaotriton_v2.so.X.Y.Z (DT_NEEDED: {', '.join(torch.hip_dyn.needed) or 'none'}); "
            "this torch links AOTriton statically or not at all, a file swap cannot change it",
            hint="rebuild torch against the prefix instead: mi100-codegen torch rebuild-recipe --prefix PREFIX",
        )


def _check_library(torch: TorchInstall, prefix: PrefixInstall) -> None:
    """Our library: unsuffixed symbols, the release line torch links, the HIP runtime torch loads."""
    want, have = torch.aot_needed, prefix.parsed
    ns = aotriton_namespaces(prefix.dyn.defined)
    suffixed = sorted(n for n in ns if n != "aotriton")
    if have.suffix or (suffixed and "aotriton" not in ns):
        _refuse(
            f"{prefix.lib.name} was built with AOTRITON_NAME_SUFFIX"
            f" ({'file name suffix ' + repr(have.suffix) if have.suffix else ''}"
            f"{', ' if have.suffix and suffixed else ''}"
            f"{'namespace ' + ', '.join(suffixed) if suffixed else ''}): its symbols are renamed "
            "and PyTorch cannot load them",
            hint="rebuild AOTriton with -DAOTRITON_NAME_SUFFIX= (empty, the default)",
        )
    if have.line != want.line:
        _refuse(
            f"release line mismatch: torch {torch.version} links AOTriton {want.tag} ({want.name}), "
            f"but {prefix.lib} is AOTriton {have.version} (release line {have.line}, torch needs {want.line})",
            hint=f"build the AOTriton release {want.tag} (git checkout {want.tag}) for this torch, "
            f"or rebuild torch against this prefix: mi100-codegen torch rebuild-recipe --prefix {prefix.root}",
        )
    theirs = torch_hip(torch.lib_dir, torch.hip_dyn, torch.hip)
    why = hip_mismatch(library_hip(prefix.dyn), theirs)
    if why:
        _refuse(f"{prefix.lib} {why}",
                hint=f"build AOTriton with the ROCm {theirs.major} HIP that torch {torch.version} uses "
                f"(torch.version.hip {torch.hip}), or install a torch wheel for the ROCm you built with")


def _check_symbols(torch: TorchInstall, prefix: PrefixInstall) -> None:
    """Every AOTriton symbol libtorch_hip needs is defined by our library."""
    original = None
    orig_path = torch.lib_dir / torch.aot_needed.name
    if orig_path.is_file():
        try:
            original = read_dynamic(orig_path)
        except ElfError:
            original = None
    needed = needed_aotriton_symbols(torch, original)
    missing = sorted(needed - set(prefix.dyn.defined))
    if missing:
        shown = "\n".join(missing[:12]) + (f"\n... and {len(missing) - 12} more" if len(missing) > 12 else "")
        _refuse(
            f"{prefix.lib} lacks {len(missing)} of the {len(needed)} AOTriton symbols "
            f"{torch.hip_lib.name} needs (import torch would fail with 'undefined symbol'):\n{shown}",
            hint=f"build the exact release torch expects ({torch.aot_needed.tag}) with the default options",
        )


def _check_images(prefix: PrefixInstall, arch: str) -> None:
    """The prefix holds kernel images for the arch."""
    img = prefix.lib_dir / IMAGES_DIR / f"amd-{arch}"
    if not img.is_dir() or not any(p.is_file() for p in img.rglob("*")):
        present = sorted(d.name for d in (prefix.lib_dir / IMAGES_DIR).glob("amd-*") if d.is_dir()) \
            if (prefix.lib_dir / IMAGES_DIR).is_dir() else []
        _refuse(
            f"{img} is missing or empty: no kernel images for {arch} "
            f"(image folders in the prefix: {', '.join(present) or 'none'}); flash attention would "
            "run nothing (or return zeros)",
            hint=f"build AOTriton for {arch} (-DAOTRITON_TARGET_ARCH={arch}) without AOTRITON_NOIMAGE_MODE",
        )


# --- plan ----------------------------------------------------------------------------------------
def _files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() or p.is_symlink()) if d.is_dir() else []


def machine_glibc() -> str | None:
    """This machine's glibc as a version node (`GLIBC_2.36`), None when not glibc."""
    try:
        v = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    parts = v.split()
    return f"GLIBC_{parts[1]}" if len(parts) == 2 and parts[0] == "glibc" else None


def open_bundle_prefix(path: Path, work: Path, arch: str | None,
                       glibc: str | None = None) -> tuple[PrefixInstall, str, BundleRecord]:
    """A bundle file, verified (every member against its manifest) and checked against this
    machine (its glibc against the library's needs), extracted below `work` as an install prefix.
    Returns the prefix, the arch and what the backup manifest records of the bundle. Every
    refusal is one message (exit 2) before anything of torch is touched."""
    b = open_bundle(path)
    m = b.manifest
    if arch is not None and arch != m.arch:
        _refuse(f"{path}: a bundle for {m.arch}, not {arch}", hint="install the bundle built for your card")
    have = glibc or machine_glibc()
    want = m.library.needs.glibc if m.library.needs else None
    if want and have and version_key(have) < version_key(want):
        _refuse(f"{path}: its library needs {want}, this machine has {have}",
                hint="use a bundle built on an older distribution, or build one here: mi100-codegen bundle build")
    root = extract(b, work)
    prefix = inspect_prefix(root)
    record = BundleRecord(file=path.name, sha256=sha256(path.read_bytes()), release=m.release, arch=m.arch,
                          hip_major=m.hip_major, label=m.label, spec_sha256=m.spec.sha256)
    return prefix, m.arch, record


def plan_install(torch: TorchInstall, prefix: PrefixInstall, arch: str, backup_dir: Path) -> InstallPlan:
    notes = check_compatible(torch, prefix, arch)
    want = torch.aot_needed
    assert want is not None
    actions: list[Action] = []
    dirs: set[str] = set()

    def add_or_replace(rel: str, src: Path) -> None:
        dest = torch.root / rel
        after = sha256_file(src)
        if dest.is_file() and not dest.is_symlink():
            before = sha256_file(dest)
            if before != after:
                actions.append(Action(rel, "replace", src, before, after))
        elif dest.exists() or dest.is_symlink():
            _refuse(f"{dest} exists and is not a regular file; refusing to replace it")
        else:
            actions.append(Action(rel, "add", src, None, after))
            parent = Path(rel).parent
            while parent != Path(".") and not (torch.root / parent).exists():
                dirs.add(parent.as_posix())
                parent = parent.parent

    img_rel = f"lib/{IMAGES_DIR}/amd-{arch}"
    src_img = prefix.lib_dir / IMAGES_DIR / f"amd-{arch}"
    ours = {p.relative_to(src_img).as_posix(): p for p in _files_under(src_img)}
    for relf in sorted(ours):
        add_or_replace(f"{img_rel}/{relf}", ours[relf])
    for p in _files_under(torch.root / img_rel):
        relf = p.relative_to(torch.root / img_rel).as_posix()
        if relf not in ours:  # stale images of another build would be loaded by our library
            actions.append(Action(f"{img_rel}/{relf}", "remove", None, sha256_file(p), None))
    add_or_replace(f"lib/{want.name}", prefix.lib)  # the library last: it switches torch over

    plan = InstallPlan(torch, prefix, arch, actions, sorted(dirs, key=lambda d: (d.count("/"), d)), notes)
    plan.identical = not actions
    if backup_dir.exists() and not plan.identical:
        _refuse(
            f"our build is already installed into {torch.root} (backup at {backup_dir}); "
            "a second install would overwrite that backup of the original files",
            hint="run `mi100-codegen torch restore` first, then install again",
        )
    return plan


# --- act -----------------------------------------------------------------------------------------
@contextmanager
def _locked(torch: TorchInstall):
    lock_path = torch.root.parent / f".{torch.root.name}.mi100-codegen.lock"
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=5)
    except Timeout:
        raise UserError(f"another mi100-codegen torch command holds {lock_path}") from None
    try:
        yield
    finally:
        lock.release()
        try:
            lock_path.unlink()
        except OSError:
            pass


def _backup_manifest(plan: InstallPlan, where: Path) -> BackupManifest:
    """What restore will read back, checked before anything is copied (one message, exit 2)."""
    torch = plan.torch
    return validate_record(BackupManifest, {
        "schema": MANIFEST_SCHEMA,
        "tool": TOOL,
        "torch_version": torch.version,
        "arch": plan.arch,
        "library": f"lib/{torch.aot_needed.name}",
        "prefix_library": plan.prefix.lib.name,
        "bundle": plan.bundle.to_json() if plan.bundle is not None else None,
        "created_dirs": plan.created_dirs,
        "entries": [
            {"path": a.rel, "action": a.kind, "sha256_before": a.sha_before, "sha256_after": a.sha_after}
            for a in plan.actions
        ],
    }, where=str(where), what="backup manifest")


def apply_install(plan: InstallPlan, backup_dir: Path) -> None:
    torch = plan.torch
    if plan.identical:
        return
    manifest = _backup_manifest(plan, backup_dir / MANIFEST)
    with _locked(torch):
        staging = backup_dir.with_name(backup_dir.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "files").mkdir(parents=True)
        for a in plan.actions:
            if a.kind in ("replace", "remove"):
                dest = staging / "files" / a.rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(torch.root / a.rel, dest)
                if sha256_file(dest) != a.sha_before:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise InstallError(f"{torch.root / a.rel} changed while it was backed up; nothing was changed")
        atomic_write(staging / MANIFEST, write_json(manifest))
        move_into_place(staging, backup_dir)  # from here on the original files are safe
        done: list[Action] = []
        try:
            for d in plan.created_dirs:
                (torch.root / d).mkdir(exist_ok=True)
            for a in plan.actions:
                dest = torch.root / a.rel
                if a.kind == "remove":
                    dest.unlink()
                else:
                    atomic_copy(a.src, dest)
                done.append(a)
        except BaseException as exc:
            try:
                _restore_from(torch, backup_dir, manifest, force=True, only=done)
            except Exception as exc2:  # pragma: no cover - double fault
                raise InstallError(
                    f"install failed ({exc}) and the rollback failed too ({exc2}); "
                    f"the original files are in {backup_dir / 'files'}",
                    hint="run `mi100-codegen torch restore --force`",
                ) from None
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise InstallError(f"install failed and was rolled back, torch is unchanged: {exc}") from None


# --- restore -------------------------------------------------------------------------------------
def read_manifest(backup_dir: Path) -> BackupManifest:
    """The backup's manifest, read as possibly hostile (codegen.models.records): every path stays
    inside the torch folder, so a damaged or planted manifest cannot make restore touch anything else."""
    path = backup_dir / MANIFEST
    if not os.path.lexists(path):
        raise UserError(f"nothing to restore: no backup at {backup_dir}",
                        hint="`mi100-codegen torch status` shows what is installed")
    hint = f"the original files are in {backup_dir / 'files'}; reinstall torch to start over"
    try:
        return read_record(BackupManifest, path, what="backup manifest", hint=hint)
    except RecordError as exc:
        raise UserError(f"{path}: damaged backup manifest ({exc.problem}); nothing was changed", hint=hint) from None


def _current_problems(torch: TorchInstall, manifest: BackupManifest) -> list[str]:
    """What changed since install; every path of the manifest is checked against the containment
    rule here, before restore touches anything (Escape, exit 2)."""
    for d in manifest.created_dirs:
        inside(torch.root, d)
    problems = []
    for e in manifest.entries:
        p = inside(torch.root, e.path)
        if e.action in ("add", "replace"):
            if not p.is_file():
                problems.append(f"{e.path}: missing (we installed it)")
            elif sha256_file(p) != e.sha256_after:
                problems.append(f"{e.path}: changed since install")
        elif p.exists():
            problems.append(f"{e.path}: exists again (we removed it)")
    return problems


def _restore_from(torch: TorchInstall, backup_dir: Path, manifest: BackupManifest, force: bool,
                  only: list[Action] | None = None) -> None:
    entries = manifest.entries
    if only is not None:
        done = {a.rel for a in only}
        entries = [e for e in entries if e.path in done]
    # the library first: torch stops using our build before its images go
    lib = manifest.library
    entries = sorted(entries, key=lambda e: (e.path != lib, e.path))
    for e in entries:
        dest = inside(torch.root, e.path)
        if e.action == "add":
            if dest.is_file() or dest.is_symlink():
                dest.unlink()
        else:
            src = inside(backup_dir / "files", e.path)
            if sha256_file(src) != e.sha256_before:
                raise UserError(f"{src}: the backup copy is damaged (sha256 differs from the manifest)")
            dest.parent.mkdir(parents=True, exist_ok=True)
            atomic_copy(src, dest)
    for d in sorted(manifest.created_dirs, key=lambda d: (-d.count("/"), d)):
        p = inside(torch.root, d)
        try:
            p.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            if not force:
                raise UserError(f"{p} holds files we did not install; left in place")
    shutil.rmtree(backup_dir)


def restore(torch: TorchInstall, backup_dir: Path, force: bool = False) -> BackupManifest:
    manifest = read_manifest(backup_dir)
    if manifest.torch_version != torch.version and not force:
        raise UserError(
            f"the backup at {backup_dir} was made for torch {manifest.torch_version}, "
            f"this is torch {torch.version} (reinstalled since?)",
            hint="restoring would put old files into a newer torch; delete the backup, or use --force",
        )
    problems = _current_problems(torch, manifest)
    if problems and not force:
        raise UserError(
            "files we installed were changed since (a torch reinstall?); restoring would overwrite them:\n"
            + "\n".join(problems),
            hint="use --force to restore anyway",
        )
    with _locked(torch):
        _restore_from(torch, backup_dir, manifest, force=force)
    return manifest
