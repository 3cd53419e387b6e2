"""Swap our AOTriton build into an installed PyTorch, and put the original back.

Plan first, then act: `plan_install` checks everything and lists every file it would add,
replace or remove (refusals raise before anything is touched); `apply_install` backs up each
file it replaces or removes (a manifest with sha256s) and changes torch in one transaction of
the engine `apply` uses (codegen.apply.journal: a journal inside the torch folder, written
before the first change, every step recorded before it runs). `restore` puts the backed-up files
back (same bytes, mode and mtime), removes what was added, checks each file at its recorded
sha256, and only then removes the backup: one transaction as well. `install_into` and
`restore_torch` are the one way in (the lock, then `recover_torch`): after a kill, Ctrl-C or a
failure at any step, torch is as before or fully installed once the next install or restore has
run, without --force, and that command says what it finished.

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
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from codegen.apply.journal import (STATE_DIR, TXN_DIR, Finished, RollbackIncomplete, RootsDiffer, StagedDiffers, Transaction, TreeBusy,
                                   TxnFailed, journal_label, pending, recover, state_of, tree_lock, write_durable)
from codegen.core.contain import Escape, inside, is_rel_path
from codegen.core.errors import CodegenError, EXIT_UPSTREAM, SystemFailure, UserError, os_failure, os_reason
from codegen.core.fsutil import sha256_file, trusted_storage
from codegen.core.ui import printable
from codegen.formats.bundle_zip import Bundle, extract
from codegen.formats.elf import ElfError, read_dynamic, version_key
from codegen.models.archs import arch_option
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
    folder: codegen.ship.layout.find_torch_dir), else beside the torch folder; one that is there
    but is no folder is refused by name (issue 36 item 11)."""
    if backup_dir is None:
        where = default_backup_dir(torch)
    else:
        name = Path(backup_dir).name
        if name in ("", ".", ".."):
            raise UserError(f"--backup-dir {backup_dir}: name a folder of its own (it is created, and removed by restore)")
        where = Path(backup_dir).parent.resolve() / name
    if os.path.lexists(where) and not os.path.islink(where) and not os.path.isdir(where):
        raise UserError(f"{'--backup-dir ' if backup_dir is not None else 'the backup folder '}{where}: a file, not a "
                        "folder; nothing was changed",
                        hint="name a folder of its own (install creates it, restore removes it), or move the file away")
    return where


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
    arch_option(arch)
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
                hint="use a bundle built on an older distribution, or build one here: mi100-codegen bundle build TREE --hip N")
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


# --- act: one transaction on the torch folder (codegen.apply.journal) ----------------------------
INSTALL_LABEL = "torch install"
RESTORE_LABEL = "torch restore"
_BACKUP_PARTS = {MANIFEST, "files"}   # what a backup folder (or its staging) holds


def _staging(backup_dir: Path) -> Path:
    """Where install builds the backup before its transaction moves it into place, and where
    restore's transaction moves it once every file is back (then removed): a temporary."""
    return backup_dir.with_name(backup_dir.name + ".tmp")


def _transaction(torch: TorchInstall, backup_dir: Path, label: str) -> Transaction:
    """A transaction on the torch folder (its journal inside it, in `.mi100-codegen/txn/`) and,
    as its second root, the folder that holds the backup (root=1)."""
    return Transaction(torch.root, (backup_dir.parent,), label)


@dataclass
class Recovered:
    """What a torch command found unfinished and finished first: lines to say."""

    said: list[str] = field(default_factory=list)


@contextmanager
def torch_session(torch: TorchInstall, backup_dir: Path) -> Iterator[Recovered]:
    """The torch folder locked (flock on the folder itself: nothing is written for the lock, the
    kernel releases it when the process dies), what an interrupted install or restore left
    finished (`recover_torch`), then the body."""
    lock = tree_lock(torch.root)
    try:
        lock.__enter__()
    except TreeBusy:
        raise UserError(f"another mi100-codegen command is changing {torch.root}", hint="let it finish") from None
    except OSError as exc:
        raise os_failure(f"cannot lock {torch.root} ({os_reason(exc)}); nothing was changed", exc) from None
    try:
        yield recover_torch(torch, backup_dir)
    finally:
        lock.__exit__(None, None, None)


def _recorded_backup(journal) -> str:
    """The backup folder a journal's operations move (root 1), by its name beside its staging."""
    names = [op.to if op.path.endswith(".tmp") else op.path for op in journal.ops if op.op == "rename"]
    base = Path(journal.roots[0]) if journal.roots else Path("?")
    return str(base / names[0]) if names else str(base)


def _vet(torch: TorchInstall, backup_dir: Path, label: str):
    """The journal may change, beside torch, the command's backup folder and its staging only."""
    names = {backup_dir.name, _staging(backup_dir).name}

    def vet(journal) -> None:
        if any(op.root == 1 and {p.split("/")[0] for p in (op.path, op.to or op.path)} - names for op in journal.ops):
            raise _other_backup(torch, label, _recorded_backup(journal))
    return vet


def _other_backup(torch: TorchInstall, label: str, recorded: str) -> UserError:
    return UserError(f"{torch.root}: an interrupted {label} was using the backup folder {recorded}, not this "
                     "command's; nothing was changed",
                     hint=f"run the command again with --backup-dir {recorded}: it finishes the {label} first")


_DONE = {INSTALL_LABEL: "our build is installed, its backup is {backup}",
         RESTORE_LABEL: "torch's own files are back and the backup is removed"}


def recover_torch(torch: TorchInstall, backup_dir: Path) -> Recovered:
    """Finish what an interrupted `torch install` or `torch restore` left: its journal in the torch
    folder says which and how far it got (rolled forward, or its undo finished; a stage without
    a journal is discarded: torch was not touched), then leftover temporaries are removed. Run by
    every install and restore before anything else, under the lock; never needs --force."""
    label = journal_label(torch.root) or "torch command"
    txn = torch.root / TXN_DIR
    state_dir = os.path.lexists(torch.root / STATE_DIR)
    hint = (f"check what torch holds (mi100-codegen torch status); to start over, reinstall torch, then remove "
            f"{txn} and {backup_dir}")
    try:
        what = recover(torch.root, (backup_dir.parent,), hint=hint, vet=_vet(torch, backup_dir, label))
    except RootsDiffer as exc:
        raise _other_backup(torch, label, _recorded_backup(exc.journal)) from None
    except TxnFailed as exc:
        raise _failed(f"finishing the interrupted {label}", exc) from None
    except RollbackIncomplete as exc:
        raise _incomplete(torch, f"finishing the interrupted {label}", exc) from None
    said = {
        "forward": f"finished the interrupted {label} (its journal: {txn}): "
                   + _DONE.get(label, "done").format(backup=backup_dir),
        "rollback": f"finished undoing the interrupted {label}: torch is as it was before it",
        "discard": f"removed what an interrupted torch command had staged in {txn}; it had changed nothing",
    }
    if what is None and state_dir and not os.path.lexists(torch.root / STATE_DIR):
        said[what] = f"removed the empty {torch.root / STATE_DIR} an interrupted torch command left"
    return Recovered(([said[what]] if what in said else []) + _sweep(torch, backup_dir))


def _sweep(torch: TorchInstall, backup_dir: Path) -> list[str]:
    """Remove the temporaries an interrupted command left: the backup's staging (never while a
    journal needs it: recovery ran first), and `.<name>.mi100-tmp` files of earlier versions'
    copies in the folders install changes. A staging that holds what no backup holds is
    refused, never removed."""
    said = []
    tmp = _staging(backup_dir)
    if os.path.islink(tmp):   # a link left there: removed itself, never followed
        tmp.unlink()
    elif tmp.is_dir():
        if set(os.listdir(tmp)) - _BACKUP_PARTS:
            raise UserError(f"{tmp}: in the way of the backup's staging, and not one install made (it holds "
                            f"{printable(sorted(set(os.listdir(tmp)) - _BACKUP_PARTS)[0])}); nothing was changed",
                            hint="move it away, or name another backup folder (--backup-dir)")
        shutil.rmtree(tmp)
        said.append(f"removed {tmp}, a backup folder an interrupted command left unfinished (nothing depends on it)")
    elif os.path.lexists(tmp):
        raise UserError(f"{tmp}: a file in the way of the backup's staging; nothing was changed",
                        hint="move it away, or name another backup folder (--backup-dir)")
    stale = [p for d in (torch.lib_dir, torch.lib_dir / IMAGES_DIR) if d.is_dir() and not d.is_symlink()
             for p in ([d / n for n in os.listdir(d)] if d == torch.lib_dir else _walk_files(d))
             if p.name.startswith(".") and p.name.endswith(".mi100-tmp") and p.is_file() and not p.is_symlink()]
    for p in stale:
        p.unlink()
    if stale:
        said.append(f"removed {len(stale)} temporary file(s) an interrupted command left in {torch.root} "
                    f"({printable(stale[0].relative_to(torch.root).as_posix())}" + (", …)" if len(stale) > 1 else ")"))
    return said


def _walk_files(top: Path) -> list[Path]:
    return [Path(d, n) for d, _dirs, names in os.walk(top) for n in names]


def _failed(doing: str, exc: TxnFailed) -> CodegenError:
    cause = exc.cause
    why = os_reason(cause) if isinstance(cause, OSError) else str(cause)
    state = "was rolled back: torch is unchanged" if exc.committed else "changed nothing"
    msg = f"{doing} failed and {state}: {why}"
    return os_failure(msg, cause) if isinstance(cause, OSError) else InstallError(msg)


def _incomplete(torch: TorchInstall, doing: str, exc: RollbackIncomplete) -> SystemFailure:
    cause = exc.cause
    why = (os_reason(cause) if isinstance(cause, OSError) else str(cause)) if cause is not None else "interrupted"
    return SystemFailure(f"{torch.root}: {doing} failed ({why}) and {len(exc.left)} path(s) could not be put back "
                         "yet:\n" + "\n".join(exc.left) + f"\nwhat is needed to finish is kept in {torch.root / TXN_DIR}",
                         hint="fix the cause (permissions, free space), then run `mi100-codegen torch restore`: every "
                              "torch install and restore finishes the undo first")


def _stage_backup(plan: InstallPlan, staging: Path) -> None:
    """The backup, complete (a copy of every file replaced or removed, then the manifest), at
    `staging`: the install's transaction moves it into place before torch's first file changes.
    Folders 0755 and files without group or other write bits whatever the umask: restore trusts
    only storage no one else can have written (trusted_storage)."""
    torch = plan.torch
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
        write_durable(staging / MANIFEST, write_json(plan.backup), 0o644)
    except OSError as exc:
        raise os_failure(f"cannot write the backup {staging} ({os_reason(exc)}); nothing was changed", exc) from None


def apply_install(plan: InstallPlan, backup_dir: Path) -> None:
    """One transaction (inside `torch_session`): the backup moved into place, then every file of
    the plan (the library last), all or nothing, recoverable after a kill at any step."""
    if plan.identical:
        return
    txn = _transaction(plan.torch, backup_dir, INSTALL_LABEL)
    txn.rename(_staging(backup_dir).name, backup_dir.name, root=1)   # the backup in place first
    for d in plan.created_dirs:
        txn.mkdir(d)
    for a in plan.actions:
        if a.kind == "remove":
            txn.delete(a.rel)
        else:
            txn.copy(a.rel, a.src, a.sha_after)
    _commit(txn, plan.torch, backup_dir, lambda: _stage_backup(plan, _staging(backup_dir)))


def _commit(txn: Transaction, torch: TorchInstall, backup_dir: Path, prepare=None) -> None:
    """`txn` committed, its failures as one message each; the staging removed unless a journal
    still needs it."""
    doing = txn.label.removeprefix("torch ")
    try:
        if prepare is not None:
            prepare()
        txn.commit()
    except StagedDiffers as exc:
        raise InstallError(f"{exc.src} changed while it was read for {doing}; nothing was changed") from None
    except Finished:
        raise Finished(f"{txn.label} had passed its commit point and was finished first"
                       + (" (torch restore undoes it)" if txn.label == INSTALL_LABEL else "")) from None
    except TxnFailed as exc:
        raise _failed(doing, exc) from None
    except RollbackIncomplete as exc:
        raise _incomplete(torch, doing, exc) from None
    finally:
        if pending(torch.root) is None:
            _sweep(torch, backup_dir)


@dataclass
class Installed:
    """What `install_into` did: the plan, and what it finished first."""

    plan: InstallPlan | None        # None: a dry run found an interrupted command unfinished (`unfinished`)
    backup_dir: Path
    recovered: Recovered
    dry_run: bool = False
    unfinished: str | None = None   # a dry run: what an interrupted command left for the next install


def unfinished(torch: TorchInstall, backup_dir: Path) -> str | None:
    """What an interrupted install or restore left for the next one to finish (None: nothing)."""
    what = pending(torch.root)
    if what is None and not os.path.lexists(_staging(backup_dir)):
        return None
    label = journal_label(torch.root) or "torch command"
    return (f"an interrupted {label} left its journal in {torch.root / TXN_DIR}" if what in ("forward", "rollback")
            else "an interrupted torch command left temporaries") + ": the next torch install or torch restore finishes it"


def install_into(torch: TorchInstall, backup_dir: Path, prepare: Callable[[Path], tuple[PrefixInstall, str, BundleRecord | None]],
                 dry_run: bool = False, replace_shipped: str | None = None) -> Installed:
    """The one torch install: `prepare(work)` gives the prefix (a bundle extracted and checked
    below `work`, or the user's), its arch and the bundle's record; then, under the lock and
    after finishing what an interrupted command left, the plan (every check) and its one
    transaction. A dry run plans only (nothing locked, finished or changed), and not at all while
    an interrupted command is unfinished (torch is then between two states: the next install
    finishes that first)."""
    with tempfile.TemporaryDirectory(prefix="mi100-bundle-") as work:
        prefix, arch, record = prepare(Path(work))
        if dry_run:
            note = unfinished(torch, backup_dir)
            plan = plan_install(torch, prefix, arch, backup_dir, bundle=record, replace_shipped=replace_shipped) if note is None else None
            return Installed(plan, backup_dir, Recovered(), True, note)
        with torch_session(torch, backup_dir) as recovered:
            plan = plan_install(torch, prefix, arch, backup_dir, bundle=record, replace_shipped=replace_shipped)
            apply_install(plan, backup_dir)
    return Installed(plan, backup_dir, recovered)


# --- restore -------------------------------------------------------------------------------------
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




def _check_belongs(torch: TorchInstall, backup_dir: Path, manifest: BackupManifest) -> None:
    """The backup vouches for this torch's install, or restore refuses, --force or not: it was made
    for this torch version, and torch's library is the one its install put there (or already the
    one it backed up). A backup of another torch would put that torch's files into this one."""
    fix = (f"its files are another torch's, not this one's: keep torch as it is, and remove the backup if you no "
           f"longer need it (rm -r {backup_dir}); `mi100-codegen torch status` shows what torch links")
    if manifest.torch_version != torch.version:
        raise UserError(f"the backup at {backup_dir} was made for torch {manifest.torch_version}, this is torch "
                        f"{torch.version} (reinstalled since?); nothing was changed", hint=fix)
    lib = next((e for e in manifest.entries if e.path == manifest.library), None)
    if lib is None:
        return
    now, after = state_of(inside(torch.root, lib.path)), lib.sha256_after or "absent"
    if now not in (after, lib.sha256_before or "absent"):
        raise UserError(f"{lib.path}: not the library the backup at {backup_dir} records installing (sha256 "
                        f"{_short(now)}, it installed {_short(after)}): the backup is not of this torch's "
                        "install; nothing was changed", hint=fix)


def _short(state: str) -> str:
    return f"{state[:12]}…" if len(state) == 64 else state


def _restore_txn(torch: TorchInstall, backup_dir: Path, manifest: BackupManifest) -> Transaction:
    """Every file back (the library first: torch stops using our build before its images go), the
    folders install made removed, every file checked at its recorded sha256, and only then the
    backup moved away (to its staging name, removed after the commit)."""
    txn = _transaction(torch, backup_dir, RESTORE_LABEL)
    entries = sorted(manifest.entries, key=lambda e: (e.path != manifest.library, e.path))
    for e in entries:
        if e.action == "add":
            txn.delete(e.path)
            continue
        parent = Path(e.path).parent.as_posix()
        if parent != "." and not inside(torch.root, parent).is_dir():   # removed since (restore --force)
            txn.mkdir(parent)
        txn.copy(e.path, inside(backup_dir / "files", e.path), e.sha256_before)
    for d in sorted(manifest.created_dirs, key=lambda d: (-d.count("/"), d)):
        txn.rmdir(d)   # left when it holds more than install added (restore --force)
    for e in entries:
        txn.check(e.path, None if e.action == "add" else e.sha256_before)
    txn.rename(backup_dir.name, _staging(backup_dir).name, root=1)
    return txn


def restore(torch: TorchInstall, backup_dir: Path, force: bool = False) -> BackupManifest:
    """Put torch's files back from the backup in one transaction (inside `torch_session`). The
    backup must vouch for this torch (`_check_belongs`, never overridden); files changed since
    install are refused unless `force`."""
    manifest = read_manifest(backup_dir)
    _check_belongs(torch, backup_dir, manifest)
    problems = _current_problems(torch, manifest)
    if problems and not force:
        raise UserError(
            "files we installed were changed since; restoring would overwrite them:\n" + "\n".join(problems),
            hint="use --force to restore anyway",
        )
    _check_copies(backup_dir, manifest)
    _commit(_restore_txn(torch, backup_dir, manifest), torch, backup_dir)
    return manifest


@dataclass
class Restored:
    manifest: BackupManifest | None   # None: the recovery left nothing to restore
    recovered: Recovered


def restore_torch(torch: TorchInstall, backup_dir: Path, force: bool = False) -> Restored:
    """The one torch restore: under the lock, what an interrupted command left finished first,
    then `restore` (when the recovery did not leave torch as it was before the install)."""
    with torch_session(torch, backup_dir) as recovered:
        if recovered.said and not os.path.lexists(backup_dir):
            return Restored(None, recovered)
        return Restored(restore(torch, backup_dir, force), recovered)
