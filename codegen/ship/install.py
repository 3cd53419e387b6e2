"""Swap our AOTriton build into an installed PyTorch, and put the original back.

Plan first, then act: `plan_install` checks everything and lists every file it would add,
replace or remove (refusals raise before anything is touched); `apply_install` backs up each
file it replaces or removes (a manifest with sha256s), then replaces files one by one with
atomic renames, and rolls back from the backup if anything fails. `restore` puts the backed-up
files back (same bytes, mode and mtime) and removes what was added.

The backup lives beside the torch package (`<site-packages>/torch.mi100-codegen-backup/`),
not inside it, so that after `restore` the torch folder is byte-identical to before.

A torch folder, a bundle and a backup may each come from someone else (docs/trust.md). Install
touches only torch's AOTriton library and `lib/aotriton.images/amd-<arch>/` (the arch a processor
name, never a path), through no symbolic link: one on the way or inside that folder is refused,
never followed or removed. A bundle passes the verdict `bundle check` makes
(codegen.ship.verdict) against the HIP runtime torch ships. Restore reads a backup only from
trusted storage (`codegen.core.fsutil.trusted_storage`: no link, only this user can have written
it), only entries that name what install touches, and puts back only bytes whose sha256 the
manifest recorded, every copy checked before the first file is touched.
"""

from __future__ import annotations

import os
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import TypeAdapter, ValidationError

from codegen.core.contain import Escape, inside, is_rel_path
from codegen.core.errors import CodegenError, EXIT_UPSTREAM, UserError, os_failure, os_reason
from codegen.core.fsutil import atomic_copy, atomic_write, move_into_place, trusted_storage
from codegen.core.ui import printable
from codegen.formats.bundle_zip import Bundle, extract, open_bundle
from codegen.formats.elf import ElfError, read_dynamic, version_key
from codegen.models.archs import Arch
from codegen.models.backup import BACKUP_SCHEMA, BackupManifest, BundleRecord
from codegen.models.records import RECORD_LIMIT, RecordError, read_record, validate_record, write_json
from codegen.ship.hip import hip_mismatch, library_hip, torch_hip
from codegen.ship.verdict import bundle_verdict, refused
from codegen.ship.layout import (
    AotLib,
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
BACKUP_LIMIT = RECORD_LIMIT   # bytes of a backup manifest: restore reads no more, install writes no more


class InstallError(CodegenError):
    """The swap failed half-way and was rolled back (or could not be)."""

    exit_code = EXIT_UPSTREAM


def default_backup_dir(torch: TorchInstall) -> Path:
    return torch.root.parent / f"{torch.root.name}.mi100-codegen-backup"


def backup_location(torch: TorchInstall, backup_dir: Path | None) -> Path:
    """The backup folder: `--backup-dir` (the folder that holds it resolved once, like the torch
    folder: codegen.ship.layout.find_torch_dir), else beside the torch folder."""
    if backup_dir is None:
        return default_backup_dir(torch)
    name = Path(backup_dir).name
    if name in ("", ".", ".."):
        raise UserError(f"--backup-dir {backup_dir}: name a folder of its own (it is created, and removed by restore)")
    return Path(backup_dir).parent.resolve() / name


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
    backup: BackupManifest | None = None    # what install will write, checked before anything is touched

    def summary(self) -> str:
        counts = {k: sum(1 for a in self.actions if a.kind == k) for k in ("add", "replace", "remove")}
        return ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "nothing to do"


# --- checks --------------------------------------------------------------------------------------
def _refuse(msg: str, hint: str | None = None) -> None:
    raise UserError(msg, hint=hint)


def check_compatible(torch: TorchInstall, prefix: PrefixInstall, arch: str) -> list[str]:
    """Every refusal of `install`, as one clear error; returns notes (non-fatal) otherwise."""
    _check_arch(arch)
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


def _check_arch(arch: str) -> None:
    """The arch names a folder below torch (`amd-<arch>`): a processor name, never a path."""
    try:
        TypeAdapter(Arch).validate_python(arch)
    except ValidationError as exc:
        _refuse(f"--arch: {exc.errors(include_url=False)[0]['msg'].removeprefix('Value error, ')}")


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
    """The files of a prefix's folder (ours: extracted from a bundle, or the user's own build)."""
    return sorted(p for p in d.rglob("*") if p.is_file() or p.is_symlink()) if d.is_dir() else []


def _torch_files(torch: TorchInstall, rel: str) -> list[str]:
    """The files below torch's folder `rel` (paths relative to torch), none reached through a
    symbolic link: a link on the way to it or anywhere inside it, anything there that is neither a
    file nor a folder, or a name the backup manifest cannot hold, is refused (exit 2), never
    followed or removed."""
    top = inside(torch.root, rel)
    if not os.path.lexists(top):
        return []
    hint = "a torch wheel holds no links there: remove it (rm), then install again"
    out = []

    def fail(exc: OSError) -> None:
        raise os_failure(f"{torch.root}: cannot read {rel} ({os_reason(exc)}); nothing was changed", exc)

    for dirpath, dirnames, filenames in os.walk(top, onerror=fail):
        for n in sorted(dirnames + filenames):
            p = Path(dirpath, n)
            st = os.lstat(p)
            rel_p = p.relative_to(torch.root).as_posix()
            where = printable(rel_p)    # a name from the torch folder: escaped in every message
            if stat.S_ISLNK(st.st_mode):
                raise Escape(f"{torch.root}: {where} is a symbolic link (to {printable(os.readlink(p))}); refusing to "
                             "follow or remove it", hint=hint)
            if stat.S_ISREG(st.st_mode):
                if not is_rel_path(rel_p):
                    raise UserError(f"{torch.root}: {where}: a file name install cannot record in its backup (it "
                                    "holds a control character or a backslash); remove or rename it")
                out.append(rel_p)
            elif not stat.S_ISDIR(st.st_mode):
                raise Escape(f"{torch.root}: {where} is neither a file nor a folder; refusing to remove it", hint=hint)
    return sorted(out)


def machine_glibc() -> str | None:
    """This machine's glibc as a version node (`GLIBC_2.36`), None when not glibc."""
    try:
        v = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    parts = v.split()
    return f"GLIBC_{parts[1]}" if len(parts) == 2 and parts[0] == "glibc" else None


def open_bundle_prefix(path: Path, work: Path, torch: TorchInstall, arch: str | None = None,
                       glibc: str | None = None) -> tuple[PrefixInstall, str, BundleRecord]:
    """A bundle file, verified (every member against its manifest), then `bundle_prefix`."""
    return bundle_prefix(open_bundle(path), work, torch, arch, glibc)


def bundle_prefix(b: Bundle, work: Path, torch: TorchInstall, arch: str | None = None,
                  glibc: str | None = None) -> tuple[PrefixInstall, str, BundleRecord]:
    """An opened bundle (`open_bundle`: every member verified against its manifest), its library
    accepted by the verdict `bundle check` makes (codegen.ship.verdict: its library's identity,
    against the version nodes of the HIP runtime torch ships, one library, its image packages
    named and decompressing), checked against this machine (its glibc against the library's
    needs) and extracted below `work` as an install prefix. Returns
    the prefix, the arch and what the backup manifest records of the bundle (the sha256 of the
    bytes that were verified, not of the file read again). Every refusal is one message (exit 2)
    before anything of torch is touched."""
    path, m = b.path, b.manifest
    if arch is not None and arch != m.arch:
        _refuse(f"{path}: a bundle for {m.arch}, not {arch}", hint="install the bundle built for your card")
    have = glibc or machine_glibc()
    want = m.library.needs.glibc if m.library.needs else None
    if want and have and version_key(have) < version_key(want):
        _refuse(f"{path}: its library needs {want}, this machine has {have}",
                hint="use a bundle built on an older distribution, or build one here: mi100-codegen bundle build")
    root = extract(b, work)
    runtime = torch_hip(torch.lib_dir, torch.hip_dyn, torch.hip)
    nodes = set(runtime.nodes) if runtime is not None and runtime.nodes else None
    why = refused(bundle_verdict(root, m, nodes))   # bundle check's verdict, against the HIP runtime torch ships
    if why:
        _refuse(f"{path}: refused by the bundle's verdict: {why}",
                hint="the bundle was changed after it was built, or built wrong: download or build it again "
                     "(`mi100-codegen bundle check FILE` refuses it the same way)")
    prefix = inspect_prefix(root)
    record = validate_record(BundleRecord, {
        "file": path.name, "sha256": b.sha256, "release": m.release, "arch": m.arch,
        "hip_major": m.hip_major, "label": m.label, "spec_sha256": m.spec.sha256}, where=str(path), what="bundle")
    return prefix, m.arch, record


def plan_install(torch: TorchInstall, prefix: PrefixInstall, arch: str, backup_dir: Path,
                 bundle: BundleRecord | None = None, replace_shipped: str | None = None) -> InstallPlan:
    """What install would do (module doc). Kernels torch's aotriton.images/ already holds for
    `arch` (torch's own: AMD's wheels ship gfx90a, gfx942, …) are replaced only when
    `replace_shipped` names that arch (`--replace-shipped`); they are backed up like any file."""
    notes = check_compatible(torch, prefix, arch)
    want = torch.aot_needed
    assert want is not None
    actions: list[Action] = []
    dirs: set[str] = set()

    def add_or_replace(rel: str, src: Path) -> None:
        dest = inside(torch.root, rel)        # no link on the way, none at the end
        after = sha256_file(src)
        if dest.is_file():
            before = sha256_file(dest)
            if before != after:
                actions.append(Action(rel, "replace", src, before, after))
        elif os.path.lexists(dest):
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
    theirs = _torch_files(torch, img_rel)
    if theirs and replace_shipped != arch and not os.path.lexists(backup_dir):
        _refuse(f"{torch.root}: {img_rel}/ already holds {len(theirs)} kernel file(s) (kernels torch ships for {arch}, "
                "or another build's): installing would replace them",
                hint=f"to replace them on purpose: --replace-shipped {arch} (backed up; `mi100-codegen torch restore` "
                     "puts them back)")
    for relf in sorted(ours):
        add_or_replace(f"{img_rel}/{relf}", ours[relf])
    for rel in theirs:
        if rel.removeprefix(f"{img_rel}/") not in ours:  # stale images of another build would be loaded by our library
            actions.append(Action(rel, "remove", None, sha256_file(torch.root / rel), None))
    add_or_replace(f"lib/{want.name}", prefix.lib)  # the library last: it switches torch over

    plan = InstallPlan(torch, prefix, arch, actions, sorted(dirs, key=lambda d: (d.count("/"), d)), notes,
                       bundle=bundle)
    plan.identical = not actions
    if os.path.lexists(backup_dir) and not plan.identical:
        _refuse(
            f"our build is already installed into {torch.root} (backup at {backup_dir}); "
            "a second install would overwrite that backup of the original files",
            hint="run `mi100-codegen torch restore` first, then install again",
        )
    if not plan.identical:
        plan.backup = _backup_manifest(plan, backup_dir / MANIFEST)
    return plan


# --- act -----------------------------------------------------------------------------------------
@contextmanager
def _locked(torch: TorchInstall):
    lock_path = torch.root.parent / f".{torch.root.name}.mi100-codegen.lock"
    if os.path.islink(lock_path):   # the lock is opened for writing: never through a link
        raise UserError(f"{lock_path} is a symbolic link (to {printable(os.readlink(lock_path))}); refusing to open it",
                        hint=f"remove it (rm {lock_path}) and run the command again")
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=5)
    except Timeout:
        raise UserError(f"another mi100-codegen torch command holds {lock_path}") from None
    except OSError as exc:
        raise os_failure(f"cannot take the lock {lock_path} ({os_reason(exc)}); nothing was changed", exc,
                         hint=f"the folder that holds torch ({lock_path.parent}) must be writable") from None
    try:
        yield
    finally:
        lock.release()
        try:
            lock_path.unlink()
        except OSError:
            pass


def _backup_manifest(plan: InstallPlan, where: Path) -> BackupManifest:
    """What restore will read back, checked before anything is copied (one message, exit 2): the
    model restore reads, within the size restore reads (BACKUP_LIMIT)."""
    torch = plan.torch
    manifest = validate_record(BackupManifest, {
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
    size = len(write_json(manifest))
    if size > BACKUP_LIMIT:
        raise UserError(f"{where}: this install's backup manifest would be {size:,} bytes, more than restore reads "
                        f"back ({BACKUP_LIMIT:,}); nothing was changed")
    problems = _not_ours(manifest)
    if problems:   # install writes only what restore accepts
        raise UserError(f"{where}: restore would not accept this install's backup manifest ({problems[0]}); "
                        "nothing was changed")
    return manifest


def _stage_backup(plan: InstallPlan, backup_dir: Path) -> None:
    """The backup, complete (a copy of every file replaced or removed, then the manifest), moved
    into place in one rename. Folders 0755 and files without group or other write bits whatever
    the umask: restore trusts only storage no one else can have written (trusted_storage)."""
    torch = plan.torch
    staging = backup_dir.with_name(backup_dir.name + ".tmp")
    if os.path.islink(staging):
        staging.unlink()          # a link left there: removed itself, never followed
    shutil.rmtree(staging, ignore_errors=True)
    try:
        (staging / "files").mkdir(parents=True)
        for a in plan.actions:
            if a.kind in ("replace", "remove"):
                dest = staging / "files" / a.rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(torch.root / a.rel, dest)
                os.chmod(dest, stat.S_IMODE(os.lstat(dest).st_mode) & ~0o022)
                if sha256_file(dest) != a.sha_before:
                    raise InstallError(f"{torch.root / a.rel} changed while it was backed up; nothing was changed")
        for d, _subdirs, _files in os.walk(staging):
            os.chmod(d, 0o755)
        atomic_write(staging / MANIFEST, write_json(plan.backup))
        move_into_place(staging, backup_dir)  # from here on the original files are safe
    except OSError as exc:
        raise os_failure(f"cannot write the backup {backup_dir} ({os_reason(exc)}); nothing was changed", exc) from None
    finally:
        if staging.is_dir() and not staging.is_symlink():
            shutil.rmtree(staging, ignore_errors=True)


def apply_install(plan: InstallPlan, backup_dir: Path) -> None:
    torch = plan.torch
    if plan.identical:
        return
    manifest = plan.backup
    with _locked(torch):
        _stage_backup(plan, backup_dir)
        done: list[Action] = []
        try:
            for d in plan.created_dirs:
                inside(torch.root, d).mkdir(exist_ok=True)
            for a in plan.actions:
                dest = inside(torch.root, a.rel)
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
def _not_ours(m: BackupManifest) -> list[str]:
    """Why a backup manifest cannot be one our install wrote (none: it can be). Install changes
    torch's AOTriton library (`library`: lib/libaotriton<suffix>_v2.so.X.Y.Z) and files below
    lib/aotriton.images/amd-<arch>/, each once, and creates only the folders on the way there."""
    lib, out = m.library, []
    name = lib.removeprefix("lib/") if lib is not None else ""
    if lib is not None and (name == lib or "/" in name or AotLib.parse(name) is None):
        out.append(f"library: {lib} is not an AOTriton library of torch's lib/")
    images = f"lib/{IMAGES_DIR}/amd-{m.arch}" if m.arch is not None else None
    seen: set[str] = set()
    for e in m.entries:
        if e.path in seen:
            out.append(f"{e.path}: listed twice")
        seen.add(e.path)
        if e.path != lib and (images is None or not e.path.startswith(images + "/")):
            out.append(f"{e.path}: not a file install changes (torch's AOTriton library, or a file below "
                       f"lib/{IMAGES_DIR}/amd-<arch>/)")
    for d in m.created_dirs:
        if images is None or not (d == f"lib/{IMAGES_DIR}" or d == images or d.startswith(images + "/")):
            out.append(f"created_dirs: {d} is not a folder install creates")
    return out


def read_manifest(backup_dir: Path) -> BackupManifest:
    """The backup's manifest, read as possibly hostile: from trusted storage only (the backup
    folder, its manifest and its files/ folder no link and writable by no one else:
    codegen.core.fsutil.trusted_storage), through its one model (codegen.models.records: every
    path relative and clean), and only when every entry names what install changes (`_not_ours`):
    a damaged or planted manifest cannot make restore touch anything else."""
    path = backup_dir / MANIFEST
    if not os.path.lexists(backup_dir) or (not os.path.islink(backup_dir) and not os.path.lexists(path)):
        raise UserError(f"nothing to restore: no backup at {backup_dir}",
                        hint="`mi100-codegen torch status` shows what is installed")
    hint = f"the original files are in {backup_dir / 'files'}; reinstall torch to start over"
    trusted_storage(backup_dir, what="backup folder")
    trusted_storage(path, what="backup manifest")
    if os.path.lexists(backup_dir / "files"):
        trusted_storage(backup_dir / "files", what="folder of backed-up files")
    try:
        manifest = read_record(BackupManifest, path, what="backup manifest", hint=hint, limit=BACKUP_LIMIT)
    except RecordError as exc:
        raise UserError(f"{path}: damaged backup manifest ({exc.problem}); nothing was changed", hint=hint) from None
    problems = _not_ours(manifest)
    if problems:
        raise UserError(f"{path}: not a backup our install wrote ({problems[0]}"
                        + (f", and {len(problems) - 1} more" if len(problems) > 1 else "") + "); nothing was changed",
                        hint=hint)
    return manifest


def _current_problems(torch: TorchInstall, manifest: BackupManifest) -> list[str]:
    """What changed since install (a folder install created that now holds more than what install
    added is one: restore could not remove it); every path of the manifest is checked against the
    containment rule here, before restore touches anything (Escape, exit 2)."""
    problems = []
    ours = {e.path for e in manifest.entries if e.action == "add"} | set(manifest.created_dirs)
    for d in manifest.created_dirs:
        p = inside(torch.root, d)
        more = sorted(n for n in os.listdir(p) if f"{d}/{n}" not in ours) if p.is_dir() else []
        if more:
            problems.append(f"{d}/{printable(more[0])}: in a folder install created, but not added by install"
                            + (f" (and {len(more) - 1} more)" if len(more) > 1 else ""))
    for e in manifest.entries:
        p = inside(torch.root, e.path)
        if e.action in ("add", "replace"):
            if not p.is_file():
                problems.append(f"{e.path}: missing (we installed it)")
            elif sha256_file(p) != e.sha256_after:
                problems.append(f"{e.path}: changed since install")
        elif os.path.lexists(p):
            problems.append(f"{e.path}: exists again (we removed it)")
    return problems


def _check_copies(backup_dir: Path, manifest: BackupManifest) -> None:
    """Every copy restore would put back is a regular file of the backup holding the bytes whose
    sha256 the manifest recorded: checked for all of them before the first file is touched."""
    for e in manifest.entries:
        if e.action == "add":
            continue
        src = inside(backup_dir / "files", e.path)
        try:
            regular = stat.S_ISREG(os.lstat(src).st_mode)
        except OSError as exc:
            raise UserError(f"{src}: cannot read the backup copy ({exc.strerror or exc}); nothing was changed") from None
        if not regular or sha256_file(src) != e.sha256_before:
            raise UserError(f"{src}: the backup copy is {'not a regular file' if not regular else 'damaged'} (not "
                            "the bytes whose sha256 the manifest recorded); nothing was changed")


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
    _check_copies(backup_dir, manifest)
    with _locked(torch):
        try:
            _restore_from(torch, backup_dir, manifest, force=force)
        except OSError as exc:
            raise os_failure(f"restore stopped ({os_reason(exc)}): the files put back so far stay, the backup "
                             f"stays in {backup_dir}", exc,
                             hint="fix the cause, then run `mi100-codegen torch restore --force`") from None
    return manifest
