"""Property tests (hypothesis) of what travels and is read back (issue 30: "a property test per
format we read from elsewhere, asserting no traceback and nothing outside its root changed"),
each folder snapshotted before and after:

- a bundle zip's members (`codegen.formats.bundle_zip`: open_bundle, then extract): random names
  (`../`, absolute, `.git/`, backslashes, NUL, control characters, non-ASCII, 30 to 2,000
  folders deep), links, FIFOs, folders, duplicate names, members the manifest lists (so that
  extraction runs) or not, byte damage on top, links planted below the extraction root. One of
  our errors (exit 2 or 3) or every member extracted; nothing outside the extraction root changed.
- a backup folder planted beside a wheel-shaped torch (`torch restore [--force]`): manifests
  whose entries name torch's own files, another arch's images, paths out, with copies that match
  their recorded hashes or not, links, missing copies, a `files/` folder that is a link. Exit 0 or
  2, no traceback; nothing outside the torch folder and the backup changed; inside torch only
  what an install of ours records (its AOTriton library, files below
  lib/aotriton.images/amd-<arch>/), each file holding bytes the manifest recorded.
- a reach record planted in an install prefix (`read_prefix_reach`, then `remove_from_prefix`:
  what `build` runs): random left-out images and members, links below the images folder. One
  UserError, or only regular files the record names below PREFIX/lib/aotriton.images/ removed.

The fields of the bundle manifest, the backup manifest and the reach record are fuzzed in
tests/test_fuzz_records.py (their reader) and tests/test_torch_trust.py (bundle and backup
manifests through the commands); kernel-cache records in their own tests.
Default run: 3 properties x 40 cases; `-m slow`: 3 x 1,000 (tests/fuzz_profiles.py)."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest
from fuzz_profiles import byte_edits, damaged, fast, slow
from hypothesis import given
from hypothesis import strategies as st

from codegen.core.errors import EXIT_USER, CodegenError, UserError
from codegen.formats.bundle_zip import MANIFEST, extract, open_bundle
from codegen.core.fsutil import sha256
from test_records import _writer_manifest
from test_torch_install import cli, snapshot
from test_torch_trust import BACKUP, template  # noqa: F401 (template: the fixture)

# ------------------------------------------------------------------------------- bundle zip --

WRITTEN, FILES = _writer_manifest()
HOSTILE_NAMES = ["../x", "../../outside/victim", "/abs/x", "/etc/x", "a/../../b", "./a", "a//b", "", ".git/config",
                 "lib/.git/x", "a\\..\\..\\b", "C:/x", "a/./b", "~/x", "lib/aotriton.images/amd-gfx908/..", "x\x00y",
                 "ü/ñ.so", "a\nb", "a\x1bb", "lib/libaotriton_v2.so.0.11.0", "spec.yaml", MANIFEST, "MANIFEST.JSON",
                 "lib/aotriton.images/amd-gfx908/flash/attn_fwd/FONLY__x.aks2", "x" * 300, "lib/" + "y" * 300]
PLAIN_NAMES = ["lib/extra.txt", "docs/readme.md", "lib/aotriton.images/amd-gfx908/flash/new.aks2", "a/b/c/d.bin"]
member_names = st.one_of(
    st.sampled_from(PLAIN_NAMES), st.sampled_from(PLAIN_NAMES), st.sampled_from(HOSTILE_NAMES),
    st.lists(st.sampled_from(["a", "..", ".", "", "lib", "x.so", "~", "ü", ".git", "aotriton.images", "amd-gfx908"]),
             min_size=1, max_size=6).map("/".join),
    st.integers(30, 2000).map(lambda n: "d/" * n + "f"),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
)
MODES = {"file": stat.S_IFREG | 0o644, "link": stat.S_IFLNK | 0o777, "fifo": stat.S_IFIFO | 0o644,
         "dir": stat.S_IFDIR | 0o755, "no mode": 0, "duplicate": stat.S_IFREG | 0o644, "setuid": stat.S_IFREG | 0o4755}


@st.composite
def bundle_zips(draw):
    members = [(draw(member_names), draw(st.sampled_from(sorted(MODES))), draw(st.binary(max_size=16)))
               for _ in range(draw(st.integers(0, 5)))]
    listing = draw(st.sampled_from(["listed", "listed", "listed", "unlisted", "no manifest"]))
    plant = draw(st.sampled_from([None, None, None, "lib", "lib/aotriton.images", "lib/aotriton.images/amd-gfx908"]))
    return members, listing, draw(st.one_of(st.just([]), st.just([]), byte_edits)), plant


def _zip_bytes(members, listing) -> bytes:
    buf, written = io.BytesIO(), dict(FILES)
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as z:
        warnings.simplefilter("ignore")  # zipfile's "Duplicate name" warning: duplicates are the point
        for name, kind, data in members:
            if kind == "dir" and not name.endswith("/"):
                name += "/"
            info = zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0))
            info.external_attr = MODES[kind] << 16
            data = b"../../outside/victim" if kind == "link" else data
            z.writestr(info, data)
            if kind == "duplicate":
                z.writestr(info, data + b"again")
            written.setdefault(info.filename, data)
        for name, data in FILES.items():
            z.writestr(name, data)
        if listing != "no manifest":
            doc = copy.deepcopy(WRITTEN)
            if listing == "listed":
                doc["files"] = {n: {"sha256": sha256(b), "size": len(b)} for n, b in written.items()}
            z.writestr(MANIFEST, json.dumps(doc))
    return buf.getvalue()


def _changed(before: dict, after: dict) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def _zip_case(case) -> bool:
    members, listing, damage, plant = case
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        (base / "outside").mkdir()
        (base / "outside" / "victim").write_bytes(b"precious\n")
        zpath = base / "b.mi100-bundle.zip"
        zpath.write_bytes(damaged(_zip_bytes(members, listing), damage))
        root = base / "root"
        root.mkdir()
        if plant:  # a link below the extraction root, pointing out
            (root / plant).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(base / "outside", root / plant)
        before = snapshot(base)
        try:
            bundle = open_bundle(zpath)
            extract(bundle, root)
        except CodegenError as exc:
            assert exc.exit_code in (2, 3) and str(exc).startswith(str(zpath)), str(exc)
            ok = False
        else:
            ok = True
            for name, blob in bundle.members.items():
                target = root / name
                assert not target.is_symlink() and target.resolve().is_relative_to(root.resolve()), name
                assert target.read_bytes() == blob, name
        changed = _changed(before, snapshot(base))
        assert all(k.startswith("root/") for k in changed), sorted(changed)[:5]
        return ok


@pytest.mark.parametrize("profile", [pytest.param(fast(40), id="default"),
                                     pytest.param(slow(1000), id="slow", marks=pytest.mark.slow)])
def test_property_bundle_zip_members_stay_inside_the_extraction_root(profile):
    @profile
    @given(bundle_zips())
    def run(case):
        _zip_case(case)

    run()


def test_the_bundle_zip_fuzzer_reaches_extraction():
    """Its starting point, our own members listed by our own manifest, is extracted (else every
    case would stop at the reader)."""
    assert _zip_case(([("lib/extra.txt", "file", b"x")], "listed", [], None))
    assert not _zip_case(([("../x", "file", b"x")], "listed", [], None))
    assert not _zip_case(([], "listed", [], "lib"))   # the planted link: refused, never written through


# ------------------------------------------------------------------- backup folder (restore) --

TORCH_FILES = ["__init__.py", "version.py", "lib/libtorch_hip.so", "lib/libamdhip64.so", "lib/libaotriton_v2.so.0.11.0",
               "lib/libaotriton_v2.so.0.12.0", "lib/aotriton.images/amd-gfx908/planted.aks2",
               "lib/aotriton.images/amd-gfx90a/flash/x.aks2", "lib/aotriton.images/amd-gfx908/../../../__init__.py",
               "../outside/victim", "/etc/passwd", "lib/aotriton.images", "lib/aotriton.images/amd-gfx908",
               "lib/./libtorch_hip.so", "lib//libaotriton_v2.so.0.11.0"]
BYTES = {"planted": b"planted bytes\n", "empty": b""}


@st.composite
def backups(draw, genuine: dict):
    """A backup manifest and its files/: entries drawn from the genuine install's and torch's own
    files, each copy matching its recorded hash or not."""
    doc = copy.deepcopy(genuine)
    # plausible: each path once, of the kinds install changes, every copy and hash consistent (a
    # backup someone made by hand to pass every check); else anything, with torch's own files
    plausible = draw(st.booleans())
    genuine_paths = sorted({e["path"] for e in genuine["entries"]})
    if plausible:
        keep = draw(st.booleans())
        fresh = [p for p in (genuine_paths + [genuine["library"], "lib/aotriton.images/amd-gfx908/x.aks2",
                                              "lib/aotriton.images/amd-gfx908/flash/y.aks2"])
                 if not (keep and p in genuine_paths)]
        chosen = draw(st.lists(st.sampled_from(fresh), unique=True, max_size=4))
    else:
        keep = draw(st.booleans())
        chosen = draw(st.lists(st.sampled_from(genuine_paths + [genuine["library"]] + TORCH_FILES), max_size=4))
    entries, copies = [], {}
    for path in chosen:
        action = draw(st.sampled_from(["add", "replace", "remove"]))
        content = draw(st.sampled_from(sorted(BYTES)))
        before = "of the copy" if plausible else draw(st.sampled_from(["of the copy", "of the copy", "random"]))
        after = "of torch's file" if plausible else draw(st.sampled_from(["of torch's file", "random"]))
        e = {"path": path, "action": action,
             "sha256_before": None if action == "add" else
             (hashlib.sha256(BYTES[content]).hexdigest() if before == "of the copy" else "e" * 64),
             "sha256_after": None if action == "remove" else after}
        entries.append(e)
        if action != "add":
            copies[path] = ("copy" if plausible else draw(st.sampled_from(["copy", "copy", "link out", "missing",
                                                                            "folder"]))), content
    doc["entries"] = (genuine["entries"] if keep else []) + entries
    dirs = genuine["created_dirs"] + ["lib", "lib/aotriton.images/amd-gfx90a", "..", "lib/aotriton.images/amd-gfx908/x"]
    if not plausible:
        doc["created_dirs"] = draw(st.lists(st.sampled_from(dirs), max_size=3))
        doc["arch"] = draw(st.sampled_from([genuine["arch"], "gfx90a", None]))
        doc["library"] = draw(st.sampled_from([genuine["library"], "lib/libtorch_hip.so", "lib/libaotriton_v2.so.0.12.0",
                                               None]))
    files_dir = "planted" if plausible else draw(st.sampled_from(["genuine", "planted", "emptied", "link out"]))
    return doc, copies, files_dir, draw(st.booleans())


def _plant(case: Path, doc: dict, copies: dict, files_dir: str) -> None:
    torch_root, backup = case / "site-packages" / "torch", case / "site-packages" / BACKUP
    for e in doc["entries"]:
        if e["sha256_after"] == "of torch's file":
            p = torch_root / e["path"]
            e["sha256_after"] = (hashlib.sha256(p.read_bytes()).hexdigest()
                                 if ".." not in e["path"] and p.is_file() and not p.is_symlink() else "f" * 64)
        elif e["sha256_after"] == "random":
            e["sha256_after"] = "f" * 64
    if files_dir in ("link out", "emptied"):
        shutil.rmtree(backup / "files")
        if files_dir == "link out":
            os.symlink(case / "outside", backup / "files")
        else:
            (backup / "files").mkdir()
    if files_dir in ("planted", "emptied"):  # the copies the entries name, beside the genuine ones or alone
        for rel, (how, content) in copies.items():
            dest = backup / "files" / rel
            if how == "missing" or ".." in rel.split("/") or rel.startswith("/"):
                continue
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):  # a copy planted where this one's folder would be
                continue
            if dest.exists() or dest.is_symlink():
                continue
            if how == "copy":
                dest.write_bytes(BYTES[content])
            elif how == "link out":
                os.symlink(case / "outside" / "victim", dest)
            else:
                dest.mkdir()
        for d, _sub, _files in os.walk(backup):
            os.chmod(d, 0o755)
    (backup / "manifest.json").write_text(json.dumps(doc))


def _ours(rel: str, arch: str) -> bool:
    """A path below the torch folder that an install of ours records."""
    name = rel.removeprefix("site-packages/torch/")
    return (name.startswith("lib/libaotriton") and "/" not in name.removeprefix("lib/")) or \
        name == "lib/aotriton.images" or name.startswith(f"lib/aotriton.images/amd-{arch}")


def _backup_case(template: Path, case_args) -> int:
    doc, copies, files_dir, force = case_args
    with tempfile.TemporaryDirectory() as d:
        case = Path(d) / "case"
        shutil.copytree(template / "installed", case, symlinks=True)
        (case / "outside").mkdir()
        (case / "outside" / "victim").write_bytes(b"precious\n")
        _plant(case, doc, copies, files_dir)
        recorded = {e["sha256_before"] for e in doc["entries"] if e.get("sha256_before")}
        genuine = json.loads((template / "installed" / "site-packages" / BACKUP / "manifest.json").read_text())
        before = snapshot(case)
        r = cli("torch", "restore", "--torch-dir", str(case / "site-packages" / "torch"), *(["--force"] if force else []))
        assert r.exit_code in (0, EXIT_USER), r.output
        assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
        after = snapshot(case)
        changed = _changed(before, after)
        outside = {k for k in changed if not k.startswith(("site-packages/torch/", f"site-packages/{BACKUP}"))}
        assert not outside, sorted(outside)[:5]
        arch = genuine["arch"]
        for k in changed:
            if not k.startswith("site-packages/torch/"):
                continue
            assert _ours(k, doc.get("arch") or arch) or _ours(k, arch), k
            if k in after and after[k][0] == "file":
                assert after[k][2] in recorded, (k, "bytes no manifest recorded")
        return r.exit_code


@pytest.mark.parametrize("profile", [pytest.param(fast(40), id="default"),
                                     pytest.param(slow(1000), id="slow", marks=pytest.mark.slow)])
def test_property_a_planted_backup_changes_only_what_our_install_records(template, profile):  # noqa: F811
    genuine = json.loads((template / "installed" / "site-packages" / BACKUP / "manifest.json").read_text())

    @profile
    @given(backups(genuine))
    def run(case_args):
        _backup_case(template, case_args)

    run()


def test_the_backup_fuzzer_starts_from_a_backup_restore_accepts(template):  # noqa: F811
    genuine = json.loads((template / "installed" / "site-packages" / BACKUP / "manifest.json").read_text())
    assert _backup_case(template, (copy.deepcopy(genuine), {}, "genuine", False)) == 0


# ------------------------------------------------------------------ reach record in a prefix --

IMAGES = ["amd-gfx908/flash/bwd_kernel_fuse/FONLY__a.aks2", "amd-gfx908/flash/attn_fwd/FONLY__b.aks2",
          "amd-gfx908/flash/bwd_kernel_fuse.zip", "amd-gfx908/flash", "amd-gfx908", "amd-gfx908/link.aks2",
          "amd-gfx908/dir-link/x.aks2", "../../../outside/victim", "../x", "/etc/passwd", "amd-gfx908/../../lib.so",
          ".git/x", "a\\..\\b", "amd-gfx908/ü.aks2", "amd-gfx908/x\x00y", "", "amd-gfx908/missing.aks2"]


@st.composite
def reach_records(draw):
    left_out = [{"image": draw(st.one_of(st.sampled_from(IMAGES), st.text(max_size=12))),
                 "member": draw(st.sampled_from([None, None, "FONLY__m", ""])), "kernels": draw(st.integers(0, 9)),
                 "functional": {"Q": "bf16"}} for _ in range(draw(st.integers(0, 4)))]
    doc = {"format": 2, "mode": "dispatched", "proven_by": "v3src/flash/iface.op_attn_bwd.cc", "reason": None,
           "fused_kernels": 12, "kernels_left_out": 6, "packages_left_out": left_out, "held": None}
    return doc, draw(st.booleans())


def _prefix(base: Path) -> Path:
    prefix = base / "prefix"
    images = prefix / "lib" / "aotriton.images"
    for rel in ("amd-gfx908/flash/bwd_kernel_fuse/FONLY__a.aks2", "amd-gfx908/flash/attn_fwd/FONLY__b.aks2",
                "amd-gfx908/flash/bwd_kernel_fuse.zip"):
        (images / rel).parent.mkdir(parents=True, exist_ok=True)
        (images / rel).write_bytes(rel.encode())
    (prefix / "lib" / "lib.so").write_bytes(b"the library\n")
    os.symlink(base / "outside" / "victim", images / "amd-gfx908" / "link.aks2")
    os.symlink(base / "outside", images / "amd-gfx908" / "dir-link")
    return prefix


def _reach_case(case) -> None:
    from codegen.imagebuild.reach import REACH_FILE, read_prefix_reach, remove_from_prefix

    doc, as_link = case
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        (base / "outside").mkdir()
        (base / "outside" / "victim").write_bytes(b"precious\n")
        (base / "outside" / "x.aks2").write_bytes(b"precious too\n")
        prefix = _prefix(base)
        record = prefix / REACH_FILE
        record.parent.mkdir(parents=True)
        if as_link:  # the record itself a link to a file elsewhere
            (base / "outside" / "reach.json").write_text(json.dumps(doc))
            os.symlink(base / "outside" / "reach.json", record)
        else:
            record.write_text(json.dumps(doc))
        before = snapshot(base)
        try:
            removed = remove_from_prefix(prefix, read_prefix_reach(prefix))
        except UserError as exc:
            assert exc.exit_code == EXIT_USER and "Traceback" not in str(exc)
            removed = None
        changed = _changed(before, snapshot(base))
        images = "prefix/lib/aotriton.images/"
        assert all(k.startswith(images) for k in changed), sorted(changed)[:5]
        named = {images + p["image"] for p in doc["packages_left_out"] if p["member"] is None}
        after = snapshot(base)  # removed (a file, or a link itself: never what it points to)
        assert all(k in named and before[k][0] in ("file", "link") and k not in after for k in changed), sorted(changed)
        assert removed is None or removed == len(changed)


@pytest.mark.parametrize("profile", [pytest.param(fast(40), id="default"),
                                     pytest.param(slow(1000), id="slow", marks=pytest.mark.slow)])
def test_property_a_planted_reach_record_removes_only_the_images_it_names(profile):
    profile(given(reach_records())(_reach_case))()
