"""Issue 30: what arrives in a torch folder. A bundle, a torch folder and a backup made elsewhere
can never make `torch install|restore|status` touch what is not ours, print a traceback, or put
text on a terminal unescaped. One test per numbered item of the issue's attack list that belongs
here, each on the real ELF fixtures (a wheel-shaped ROCm torch with its HIP 6 runtime, bundles
made with the bundle writer), each asserting that nothing outside changed (a snapshot of the
test's whole folder): items 1 (arch), 2 (links inside torch), 3 (planted backups), 6 (the
tracebacks of install, status and restore; the manifest ones are in tests/test_records.py), 7
(install checks what `bundle check` checks), 8 (bounded to what restore reads back), 9 (terminal
escapes), 10 (one canonical torch folder), 12 (`torch status` without torch exits 3, after showing
what it detected: issue 39). Then
property tests (hypothesis) of the bundle zip, its manifest and the backup manifest through the
commands: 3 x 20 cases in the default run, 3 x 300 under `-m slow`."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from fuzz_profiles import byte_edits, damaged, fast, slow
from hypothesis import given
from hypothesis import strategies as st

from codegen.core.errors import EXIT_UPSTREAM, EXIT_USER
from codegen.formats.bundle_zip import open_bundle
from codegen.core.fsutil import sha256
from codegen.formats.elf import parse_dynamic, read_dynamic
from codegen.ship.identity import library_identity
from test_fuzz_data_files import _encode, _mutate
from test_torch_hip_runtime import fake_hip
from test_torch_install import SYM_BWD, SYM_CHECK, SYM_FWD, _cc, aot_source, cli, site, snapshot  # noqa: F401
from test_torch_install_bundle import make_bundle, wheel  # noqa: F401 (wheel: the fixture)

LIB = "lib/libaotriton_v2.so.0.11.0"
BACKUP = "torch.mi100-codegen-backup"


def rezip(src: Path, out: Path, manifest=None, files: dict[str, bytes] | None = None) -> Path:
    """`src` written again to `out` with `files` replacing or adding members and `manifest(m)`
    changing the manifest; every member's sha256 and size listed again (a bundle someone re-made)."""
    with zipfile.ZipFile(src) as z:
        m = json.loads(z.read("manifest.json"))
        members = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
    members.update(files or {})
    if manifest is not None:
        manifest(m)
    m["files"] = {n: {"sha256": sha256(b), "size": len(b)} for n, b in members.items()}
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("manifest.json", json.dumps(m))
        for n, b in members.items():
            z.writestr(n, b)
    return out


def install(site: Path, bundle: Path, *args: str):
    return cli("torch", "install", "--bundle", str(bundle), "--torch-dir", str(site / "torch"), *args)


def refused(r, *words: str, code: int = EXIT_USER) -> None:
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    assert all(w in " ".join(r.output.split()) for w in words), r.output


# ------------------------------------------------------------------ 1: the arch is never a path --

@pytest.mark.parametrize("arch", ["gfx90a/../../..", "gfx908/../../../../bundle/payload"])
def test_1_a_manifest_arch_that_is_a_path_is_refused_before_anything(wheel, tmp_path, arch):
    b = rezip(make_bundle(tmp_path / "mk"), tmp_path / "b.zip", lambda m: m.update(arch=arch))
    before = snapshot(tmp_path)
    for dry in ((), ("--dry-run",)):
        refused(install(wheel, b, *dry), "manifest.json: arch:")
    assert snapshot(tmp_path) == before


def test_1_an_arch_option_that_is_a_path_is_refused(wheel, tmp_path):
    from test_torch_install import build_prefix

    prefix = build_prefix(tmp_path / "prefix")
    before = snapshot(tmp_path)
    r = cli("torch", "install", "--prefix", str(prefix), "--arch", "gfx908/../../..", "--torch-dir",
            str(wheel / "torch"), "--dry-run")
    refused(r, "--arch: 'gfx908/../../..' is not an AMDGPU processor LLVM knows")
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------- 2: no link inside torch followed --

@pytest.mark.parametrize("where", ["lib/aotriton.images/amd-gfx908", "lib/aotriton.images",
                                   "lib/aotriton.images/amd-gfx908/flash", "lib/aotriton.images/amd-gfx908/old.aks2",
                                   "lib/libaotriton_v2.so.0.11.0"])
def test_2_install_never_follows_a_link_inside_torch(wheel, tmp_path, where):
    """A link where install would read, write or delete (the arch's image folder, the images
    folder, a folder or a stale image inside it, the library) is refused with its name: the link's
    target, a user's folder with files, is never touched, and `--dry-run` lists nothing."""
    b = make_bundle(tmp_path / "mk")
    user = tmp_path / "user"
    (user / "flash").mkdir(parents=True)
    (user / "precious.txt").write_text("mine\n")
    (user / "flash" / "kept.aks2").write_bytes(b"mine too")
    link = wheel / "torch" / where
    if link.exists():
        shutil.rmtree(link) if link.is_dir() else link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(user / "precious.txt" if where.endswith((".aks2", ".0")) else user)
    before = snapshot(tmp_path)
    for dry in (("--dry-run",), ()):
        r = install(wheel, b, *dry)
        refused(r, "is a symbolic link")
        assert not [ln for ln in r.output.splitlines() if ln.startswith(("add ", "remove ", "replace "))], r.output
    assert snapshot(tmp_path) == before


def test_2_links_beside_torch_are_never_written_through(wheel, tmp_path):
    """A link where install stages its backup is removed itself (its target kept); the lock is
    taken on the torch folder itself, so nothing is opened for writing beside it."""
    b = make_bundle(tmp_path / "mk")
    user = tmp_path / "user"
    user.mkdir()
    (user / "precious.txt").write_text("mine\n")
    staging = wheel / f"{BACKUP}.tmp"
    staging.symlink_to(user)
    before = snapshot(user)
    r = install(wheel, b)
    assert r.exit_code == 0, r.output
    assert snapshot(user) == before and not os.path.lexists(staging)
    assert (wheel / BACKUP / "manifest.json").is_file()
    assert sorted(p.name for p in wheel.iterdir()) == sorted(["torch", BACKUP, "link-time"])


# ------------------------------------------------------------------- 3: planted backup manifests --

def _installed(site: Path, tmp_path: Path, *args: str) -> Path:
    """The bundle installed (with a stale image of another build that install removes, so the
    backup holds a copy of it); returns the backup folder."""
    stale = site / "torch" / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / "zz-old.aks2"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an image of another build")
    r = install(site, make_bundle(tmp_path / "mk"), "--replace-shipped", "gfx908", *args)
    assert r.exit_code == 0, r.output
    return Path(args[-1]) if args else site / BACKUP


def restore(site: Path, *args: str):
    return cli("torch", "restore", "--torch-dir", str(site / "torch"), *args)


def test_3_a_planted_manifest_naming_files_install_never_touches_is_refused(wheel, tmp_path):
    backup = _installed(wheel, tmp_path)
    man = json.loads((backup / "manifest.json").read_text())
    planted = b"import os  # planted\n"
    (backup / "files" / "__init__.py").write_bytes(planted)
    hip = (wheel / "torch" / "lib" / "libtorch_hip.so").read_bytes()
    init = (wheel / "torch" / "__init__.py").read_bytes()
    man["entries"] += [{"path": "__init__.py", "action": "replace", "sha256_before": sha256(planted),
                        "sha256_after": sha256(init)},
                       {"path": "lib/libtorch_hip.so", "action": "add", "sha256_before": None,
                        "sha256_after": sha256(hip)}]
    (backup / "manifest.json").write_text(json.dumps(man))
    before = snapshot(tmp_path)
    for force in ((), ("--force",)):
        refused(restore(wheel, *force), "not a backup our install wrote (__init__.py: not a file install changes")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("how", ["writable by others", "another owner"])
def test_3_a_backup_someone_else_could_write_is_refused(wheel, tmp_path, how):
    shared = tmp_path / "shared"
    shared.mkdir()
    backup = _installed(wheel, tmp_path, "--backup-dir", str(shared / "bk"))
    if how == "writable by others":
        os.chmod(backup, 0o777)
        words = "others (mode 0777): any of them could have written anything into it"
    else:
        os.chown(backup / "manifest.json", 4242, 4242)
        words = "this backup manifest belongs to uid 4242"
    before = snapshot(tmp_path)
    for force in ((), ("--force",)):
        refused(restore(wheel, "--backup-dir", str(backup), *force), words)
    r = cli("torch", "status", "--torch-dir", str(wheel / "torch"), "--backup-dir", str(backup))
    assert r.exit_code == 0 and f"problem: {backup}" in " ".join(r.stdout.split()) and words in r.stdout, r.stdout
    assert snapshot(tmp_path) == before


def test_3_a_backup_copy_that_is_not_the_recorded_bytes_is_refused_before_anything(wheel, tmp_path):
    """Every copy is checked against the sha256 install recorded before the first file goes back:
    the library (put back first) stays ours."""
    backup = _installed(wheel, tmp_path)
    copy = backup / "files" / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / "zz-old.aks2"
    copy.write_bytes(b"other bytes")
    before = snapshot(tmp_path)
    for force in ((), ("--force",)):
        refused(restore(wheel, *force), "zz-old.aks2: the backup copy is damaged (not the bytes whose sha256 the "
                                        "manifest recorded); nothing was changed")
    assert snapshot(tmp_path) == before


def test_3_a_folder_install_created_that_holds_more_is_found_before_anything(wheel, tmp_path):
    """Found by the property test below (`-m slow`): restore put every file back, then refused to
    remove a folder install had created that held another file (exit 2, half done). Now that is
    found before the first file goes back; `--force` restores and leaves the folder."""
    _installed(wheel, tmp_path)
    mine = wheel / "torch" / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / "attn_fwd" / "mine.aks2"
    mine.write_bytes(b"not installed by us")
    before = snapshot(tmp_path)
    refused(restore(wheel), "attn_fwd/mine.aks2: in a folder install created, but not added by install")
    assert snapshot(tmp_path) == before
    assert restore(wheel, "--force").exit_code == 0
    assert mine.read_bytes() == b"not installed by us" and not (wheel / BACKUP).exists()


def test_3_a_backup_folder_replaced_by_a_link_is_refused(wheel, tmp_path):
    backup = _installed(wheel, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    backup.rename(elsewhere)
    backup.symlink_to(elsewhere)
    before = snapshot(tmp_path)
    refused(restore(wheel, "--force"), f"{backup}: this backup folder is a symbolic link (to {elsewhere})")
    r = cli("torch", "status", "--torch-dir", str(wheel / "torch"))
    assert r.exit_code == 0 and "problem:" in r.stdout and "is a symbolic link" in r.stdout, r.output
    assert snapshot(tmp_path) == before


def test_3_install_then_restore_of_our_own_backup_is_byte_identical(wheel, tmp_path):
    """The rules above refuse nothing install writes: a backup in a --backup-dir, made under a
    umask that lets everyone write, restores byte-identically (install sets its modes itself)."""
    before = snapshot(wheel)
    old = os.umask(0)
    try:
        r = install(wheel, make_bundle(tmp_path / "mk"), "--backup-dir", str(tmp_path / "bk"))
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    assert restore(wheel, "--backup-dir", str(tmp_path / "bk")).exit_code == 0
    assert snapshot(wheel) == before and not (tmp_path / "bk").exists()


# ------------------------------------------------------------------------------ 6: tracebacks --

def test_6_a_member_1900_folders_deep_is_one_message(wheel, tmp_path):
    deep = "/".join(["a"] * 1900) + "/x"
    b = rezip(make_bundle(tmp_path / "mk"), tmp_path / "deep.zip", files={deep: b"x"})
    before = snapshot(tmp_path)
    refused(install(wheel, b), "more than 32 folders deep")
    assert snapshot(tmp_path) == before


def _patched_member(src: Path, out: Path, how: str) -> Path:
    """`src` with one more member, deflated and listed, whose zip entry is then broken: its
    compressed data not deflate, its compression method unknown, or flagged as encrypted."""
    rezip(src, out, files={"lib/extra.bin": b"x" * 4096})
    with zipfile.ZipFile(out) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n, b in members.items():
            z.writestr(n, b)
        info = z.getinfo("lib/extra.bin")
    raw = bytearray(out.read_bytes())
    central = raw.rindex(b"lib/extra.bin") - 46      # its central directory entry (after every member)
    assert raw[central:central + 4] == b"PK\x01\x02"
    if how == "not deflate":
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        raw[start:start + 8] = b"\xff" * 8
    elif how == "unknown method":
        raw[central + 10:central + 12] = (99).to_bytes(2, "little")
    else:
        raw[central + 8] |= 1
    out.write_bytes(bytes(raw))
    return out


@pytest.mark.parametrize("how", ["not deflate", "unknown method", "encrypted"])
def test_6_a_member_that_cannot_be_read_is_one_message(wheel, tmp_path, how):
    """Found by the property test below (`-m slow`): a flipped byte in a deflated member was a
    zlib.error traceback."""
    b = _patched_member(make_bundle(tmp_path / "mk"), tmp_path / "broken.zip", how)
    before = snapshot(tmp_path)
    refused(install(wheel, b), "corrupt bundle")
    assert snapshot(tmp_path) == before


def test_6_an_immutable_site_packages_is_one_message(wheel, tmp_path):
    b = make_bundle(tmp_path / "mk")
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(wheel)], capture_output=True).returncode:
        pytest.skip("no immutable flag on this file system (chattr +i)")
    try:
        before = snapshot(tmp_path)
        refused(install(wheel, b), "cannot write the backup", "Operation not permitted", "nothing was changed")
        assert snapshot(tmp_path) == before
    finally:
        subprocess.run(["chattr", "-i", str(wheel)], capture_output=True)


# -------------------------------------------------------- 7: install checks what bundle check checks --

def _relinked(tmp_path: Path, name: str, *flags: str) -> Path:
    """The fixture bundle with its library linked again with `flags` (other HIP runtimes, an
    RPATH), its manifest's GLIBC need stated truly."""
    base = make_bundle(tmp_path / "mk")
    lib = tmp_path / name / "libaotriton_v2.so.0.11.0"
    lib.parent.mkdir(parents=True)
    src = aot_source("mi100", [SYM_FWD, SYM_BWD, SYM_CHECK]) + (
        "int hipInit(unsigned);\nint hipGetDevicePropertiesR0600(void *, int);\n"
        "int use_hip(void) { return hipInit(0) + hipGetDevicePropertiesR0600(0, 0); }\n")
    _cc(lib, src, "-Wl,-soname,libaotriton_v2.so.0.11.0", "-Wl,--no-as-needed", *flags)
    glibc = read_dynamic(lib).highest("GLIBC")
    return rezip(base, tmp_path / f"{name}.zip", lambda m: m["library"]["needs"].update(glibc=glibc),
                 {LIB: lib.read_bytes()})


def _hip_dir(tmp_path: Path, soname: str, major: int) -> Path:
    d = tmp_path / f"hip-{soname}"
    if soname == "libamdhip64.so":   # the unversioned name as its SONAME
        d.mkdir()
        _cc(d / soname, "int hipInit(unsigned f) { return (int)f; }\nint hipGetDevicePropertiesR0600(void *p, int d) "
            "{ return d; }\n", "-Wl,-soname,libamdhip64.so")
    else:
        fake_hip(d / soname, major)
    return d


@pytest.mark.parametrize("case", ["unversioned", "two majors", "rpath"])
def test_7_install_refuses_what_bundle_check_refuses(wheel, tmp_path, case):
    hip6 = _hip_dir(tmp_path, "libamdhip64.so.6", 6)
    link6 = (f"-L{hip6}", "-l:libamdhip64.so.6")
    flags, words = {
        "unversioned": ((f"-L{_hip_dir(tmp_path, 'libamdhip64.so', 6)}", "-l:libamdhip64.so"),
                        "DT_NEEDED names the HIP runtime of its major (needs libamdhip64.so;"),
        "two majors": ((*link6, f"-L{_hip_dir(tmp_path, 'libamdhip64.so.7', 7)}", "-l:libamdhip64.so.7"),
                       "(needs libamdhip64.so.6, libamdhip64.so.7;"),
        "rpath": ((*link6, "-Wl,-rpath,/tmp/attacker-libs"), "no RPATH/RUNPATH outside the library's folder (RPATH"),
    }[case]
    b = _relinked(tmp_path, case, *flags)
    before = snapshot(tmp_path)
    for dry in (("--dry-run",), ()):
        refused(install(wheel, b, *dry), words, "/tmp/attacker-libs" if case == "rpath" else "refused by the bundle's verdict")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("field,value,claim,words", [
    ("release", "0.13b", "the library is AOTriton 0.13b's, as the manifest states",
     "(SONAME libaotriton_v2.so.0.11.0, file lib/libaotriton_v2.so.0.11.0; release 0.13b installs"),
    ("hip_major", 7, "DT_NEEDED names the HIP runtime of its major",
     "(needs libamdhip64.so.6; a HIP 7 torch wheel loads libamdhip64.so.7"),
    ("needs", "GLIBC_2.17", "GLIBC/GLIBCXX needs as the manifest states", "manifest GLIBC_2.17"),
    ("soname", "libaotriton_v2.so.0.13.0", "the ELF facts the manifest lists are the library's",
     "(soname: manifest 'libaotriton_v2.so.0.13.0', file 'libaotriton_v2.so.0.11.0')"),
])
def test_7_a_relabelled_claim_is_refused_by_install_and_bundle_check(wheel, tmp_path, field, value, claim, words):
    """A claim the manifest makes of the library, changed (the members and their hashes intact):
    install refuses it before anything is touched, and the identity claims `bundle check` makes
    (the same function) fail for it."""
    def change(m):
        if field == "needs":
            m["library"]["needs"]["glibc"] = value
        elif field == "soname":
            m["library"]["soname"] = value
        else:
            m[field] = value
            m.pop("version", None)
    b = rezip(make_bundle(tmp_path / "mk"), tmp_path / "relabelled.zip", change)
    before = snapshot(tmp_path)
    refused(install(wheel, b), claim, words)
    assert snapshot(tmp_path) == before
    opened = open_bundle(b)
    claims = library_identity(parse_dynamic(opened.members[LIB]), opened.manifest, None)
    assert [c.name for c in claims if not c.ok] == [claim], claims


def test_7_the_fixture_bundle_passes_every_identity_claim(wheel, tmp_path):
    """The counterpart of the refusals above: the unchanged bundle's library passes every claim,
    the version nodes read from the runtime the wheel ships included."""
    from codegen.ship.hip import torch_hip
    from codegen.ship.layout import inspect_torch

    t = inspect_torch(wheel / "torch")
    nodes = torch_hip(t.lib_dir, t.hip_dyn, t.hip).nodes
    assert nodes == {"hip_4.2", "hip_6.0"}
    opened = open_bundle(make_bundle(tmp_path / "mk"))
    claims = library_identity(parse_dynamic(opened.members[LIB]), opened.manifest, set(nodes))
    assert all(c.ok for c in claims) and len(claims) == 7, claims


# ----------------------------------------------------------- 8: bounded to what restore reads back --

@pytest.mark.parametrize("size", [1 << 20, 17 << 20])
def test_8_a_huge_label_is_refused_at_install(wheel, tmp_path, size):
    b = rezip(make_bundle(tmp_path / "mk"), tmp_path / "label.zip", lambda m: m.update(label="x" * size))
    before = snapshot(tmp_path)
    refused(install(wheel, b), "manifest.json: label: String should have at most 200 characters" if size < 16 << 20
            else "manifest.json is larger than 16,777,216 bytes")
    assert snapshot(tmp_path) == before


def test_8_install_writes_no_backup_manifest_restore_would_not_read(wheel, tmp_path, monkeypatch):
    from codegen.ship import install as inst

    b = make_bundle(tmp_path / "mk")
    monkeypatch.setattr(inst, "BACKUP_LIMIT", 600)
    before = snapshot(tmp_path)
    refused(install(wheel, b, "--dry-run"), "more than restore reads back (600)")
    refused(install(wheel, b), "more than restore reads back (600)")
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------- 9: terminal escapes --

def test_9_status_prints_a_torch_folders_text_escaped(wheel, tmp_path):
    version = wheel / "torch" / "version.py"
    version.write_text(version.read_text().replace("__version__ = '2.9.0+rocm6.4'",
                                                   "__version__ = '2.9.0\\x1b[31m\\nproblem:          forged'"))
    r = cli("torch", "status", "--torch-dir", str(wheel / "torch"))
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.stdout and "2.9.0\\x1b[31m\\nproblem:          forged" in r.stdout, r.stdout
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith("problem:")], r.stdout


def test_9_a_label_with_escapes_never_reaches_the_terminal(wheel, tmp_path):
    backup = _installed(wheel, tmp_path)
    man = json.loads((backup / "manifest.json").read_text())
    man["bundle"]["label"] = "CPU-built\x1b[2J\nproblem:          forged"
    (backup / "manifest.json").write_text(json.dumps(man))
    r = cli("torch", "status", "--torch-dir", str(wheel / "torch"))
    problems = [ln for ln in r.stdout.splitlines() if ln.startswith("problem:")]
    assert r.exit_code == 0 and "\x1b" not in r.stdout and len(problems) == 1, r.stdout
    assert "holds a control character" in problems[0] and "\\x1b[2J\\nproblem:" in problems[0], problems
    r = restore(wheel)
    assert r.exit_code == 2 and "\x1b" not in r.output and "\\x1b[2J" in r.output, r.output


def test_9_a_stale_files_name_is_printed_escaped(wheel, tmp_path):
    """A file of torch's image folder whose name holds control characters: install cannot record
    it in a backup restore reads (a clean relative path), so it refuses, naming it escaped."""
    stale = wheel / "torch" / "lib" / "aotriton.images" / "amd-gfx908" / "old\x1b[2J\nadd      forged.aks2"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    b = make_bundle(tmp_path / "mk")
    before = snapshot(tmp_path)
    r = install(wheel, b, "--dry-run")
    refused(r, "lib/aotriton.images/amd-gfx908/old\\x1b[2J\\nadd forged.aks2", "remove or rename it")
    assert "\x1b" not in r.output and not [ln for ln in r.output.splitlines() if ln.startswith("add")], r.output
    assert snapshot(tmp_path) == before


def test_9_bundle_check_prints_what_the_library_says_escaped(capsys):
    from codegen.cli.bundle import _print_check
    from codegen.ship.check import CheckReport
    from codegen.ship.identity import Claim

    rep = CheckReport("b.zip", None)
    rep.claims = [Claim("no RPATH/RUNPATH outside the library's folder", False, "RPATH ['/tmp/\x1b[2J\nok   forged']")]
    rep.as_json = lambda: {"label": "CPU-built"}
    _print_check(rep)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "/tmp/\\x1b[2J\\nok   forged" in err and "\nok   forged" not in err, err


# --------------------------------------------------------------------- 10: one canonical folder --

def test_10_install_through_a_link_and_restore_through_the_real_path(wheel, tmp_path):
    before = snapshot(wheel)
    link = tmp_path / "torch-link"
    link.symlink_to(wheel / "torch")
    r = cli("torch", "install", "--bundle", str(make_bundle(tmp_path / "mk")), "--torch-dir", str(link))
    assert r.exit_code == 0, r.output
    assert (wheel / BACKUP).is_dir() and not (tmp_path / f"{link.name}.mi100-codegen-backup").exists()
    s = json.loads(cli("torch", "status", "--torch-dir", str(link), "--json").stdout)
    assert s["ours_installed"] is True and s["torch_dir"] == str((wheel / "torch").resolve())
    r = restore(wheel)
    assert r.exit_code == 0, r.output
    assert snapshot(wheel) == before


# ------------------------------------------------------------------ 12: status without torch --

def test_12_status_without_torch_in_the_environment_exits_3(monkeypatch, tmp_path):
    """Issue 39 item 3: it still shows what it detected (this Python, the card, the HSA override),
    that torch is missing and the one next step, text and JSON; the exit code stays 3."""
    import importlib.util

    from owner_machine import sysfs

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    machine = str(sysfs(tmp_path / "sys", "gfx1031"))
    r = cli("torch", "status", "--sysfs", machine)
    refused(r, "torch: none in this Python", "card: gfx1031 -> bundle arch gfx1030, spec rdna2", code=EXIT_UPSTREAM)
    assert f"Python: {platform.python_version()} ({sys.executable})" in " ".join(r.stdout.split())
    assert "HSA_OVERRIDE_GFX_VERSION=10.3.0: NOT set" in r.stdout
    assert "missing:          torch: this Python" in r.stdout
    assert "missing:          HSA_OVERRIDE_GFX_VERSION=10.3.0 in this environment" in r.stdout
    assert "next:             install mi100-codegen into the environment of your ROCm PyTorch" in r.stdout
    r = cli("torch", "status", "--sysfs", machine, "--json")
    assert r.exit_code == EXIT_UPSTREAM, r.output
    s = json.loads(r.stdout)
    assert s["torch_found"] is False and s["torch_dir"] is None and s["python"]["executable"] == sys.executable
    assert s["machine"]["card"]["family"]["spec"] == "rdna2" and s["hsa_override"] is None
    assert len(s["missing"]) == 2 and s["next"].startswith("install mi100-codegen into the environment")


def test_12_the_exit_code_page_says_what_the_code_does_for_a_missing_environment():
    """docs/reference/exit-codes.md is generated (scripts/mkdocs_hooks.py) from codegen.core.errors:
    its row for 3 names a missing environment and the class every such refusal raises."""
    import importlib.util as iu

    from codegen.core.errors import EnvironmentMissing

    hooks = Path(__file__).resolve().parents[1] / "scripts" / "mkdocs_hooks.py"
    spec = iu.spec_from_file_location("mkdocs_hooks", hooks)
    mod = iu.module_from_spec(spec)
    spec.loader.exec_module(mod)
    row = next(line for line in mod.exit_codes_reference().splitlines() if line.startswith(f"| {EXIT_UPSTREAM} |"))
    assert "missing environment (no torch" in row and "`EnvironmentMissing`" in row, row
    assert EnvironmentMissing.exit_code == EXIT_UPSTREAM


# -------------------------------------------------------------------------- property tests --

@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A case folder: a wheel-shaped torch in site-packages, the fixture bundle beside it."""
    from test_torch_hip_runtime import torch_with_hip
    from test_torch_install import need_cc

    need_cc()
    base = tmp_path_factory.mktemp("fuzz")
    torch_with_hip(base / "case" / "site-packages", 6)
    shutil.copy2(make_bundle(base / "mk"), base / "case" / "b.zip")
    installed = base / "installed"
    shutil.copytree(base / "case", installed, symlinks=True)
    assert install(installed / "site-packages", installed / "b.zip").exit_code == 0
    return base


OURS = ("site-packages/torch/", f"site-packages/{BACKUP}")


def _case(template: Path, which: str, prepare, *args: str) -> int:
    """Copy the template's `which` folder into a fresh parent, let `prepare` plant the input, run
    the command; then: no traceback, exit 0 or 2, and nothing changed in the parent folder but
    torch and its backup, and those only when the command succeeded."""
    with tempfile.TemporaryDirectory() as d:
        case = Path(d) / "case"
        shutil.copytree(template / which, case, symlinks=True)
        prepare(case)
        before = snapshot(Path(d))
        r = cli(*[a.replace("CASE", str(case)) for a in args])
        assert r.exit_code in (0, EXIT_USER), r.output
        assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
        after = snapshot(Path(d))
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        if r.exit_code:
            assert not changed, sorted(changed)[:5]
        else:
            assert all(k.startswith(tuple(f"case/{o}" for o in OURS)) for k in changed), sorted(changed)[:5]
        return r.exit_code


INSTALL = ("torch", "install", "--bundle", "CASE/b.zip", "--torch-dir", "CASE/site-packages/torch")


def _bundle_zip(template: Path, edits) -> None:
    def prepare(case: Path) -> None:
        (case / "b.zip").write_bytes(damaged((case / "b.zip").read_bytes(), edits))
    _case(template, "case", prepare, *INSTALL)


def _manifest_doc(template: Path) -> dict:
    with zipfile.ZipFile(template / "case" / "b.zip") as z:
        return json.loads(z.read("manifest.json"))


@st.composite
def manifests(draw, doc):
    return _encode(draw, _mutate(draw, doc))


def _bundle_manifest(template: Path, content: bytes) -> None:
    def prepare(case: Path) -> None:
        with zipfile.ZipFile(template / "case" / "b.zip") as z:
            members = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
        with zipfile.ZipFile(case / "b.zip", "w") as z:
            z.writestr("manifest.json", content)
            for n, b in members.items():
                z.writestr(n, b)
    _case(template, "case", prepare, *INSTALL)


def _backup_manifest(template: Path, content: bytes) -> None:
    def prepare(case: Path) -> None:
        (case / "site-packages" / BACKUP / "manifest.json").write_bytes(content)
    _case(template, "installed", prepare, "torch", "status", "--torch-dir", "CASE/site-packages/torch")
    _case(template, "installed", prepare, "torch", "restore", "--torch-dir", "CASE/site-packages/torch")


def _backup_doc(template: Path) -> dict:
    return json.loads((template / "installed" / "site-packages" / BACKUP / "manifest.json").read_text())


def _run(template: Path, kind: str, profile) -> None:
    if kind == "bundle zip":
        strategy, case = byte_edits, _bundle_zip
    elif kind == "bundle manifest":
        strategy, case = manifests(_manifest_doc(template)), _bundle_manifest
    else:
        strategy, case = manifests(_backup_doc(template)), _backup_manifest

    @profile
    @given(strategy)
    def run(value):
        case(template, value)

    run()


KINDS = ["bundle zip", "bundle manifest", "backup manifest"]


@pytest.mark.parametrize("kind", KINDS)
def test_property_no_traceback_and_nothing_outside_changes(template, kind):
    _run(template, kind, fast(20))


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_property_no_traceback_and_nothing_outside_changes_slow(template, kind):
    _run(template, kind, slow(300))


def test_property_inputs_unchanged_are_accepted(template):
    """The fuzzers start from inputs the commands accept (else every case would be a refusal)."""
    assert _case(template, "case", lambda case: None, *INSTALL) == 0
    assert _case(template, "installed", lambda case: None, "torch", "restore", "--torch-dir",
                 "CASE/site-packages/torch") == 0
