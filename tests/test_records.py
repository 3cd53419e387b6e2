"""Every record we read is one model, read through one function (codegen.models.records): the
bundle manifest (bundle check, torch install), the torch backup manifest (restore, status) and
the reach records are refused with one located message, exit 2, no traceback, for the inputs of
the trust issue (a `hip_major` of "six" or NaN, no `arch`, 100,000-deep nesting, `library` or
`library.needs` a string, a 10 MB arch, GLIBC_ with 5,000 digits, a 17 MiB label, a backup
manifest whose `bundle` is a string, a key twice in one object, which readers resolve differently);
and the bundle writer's manifest.json is byte for byte what
it wrote before it went through the model."""

from __future__ import annotations

import json
import platform
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from codegen.core.errors import EXIT_USER, UserError
from codegen.formats.bundle_zip import MANIFEST, manifest_of, open_bundle, write_bundle
from codegen.core.fsutil import sha256
from codegen.models.records import RecordError, parse_record, read_record
from codegen.models.reach import Reach
from test_bundle_units import minimal_manifest
from test_torch_install import cli, site, snapshot  # noqa: F401 (site: the fixture)

LIB = "lib/libaotriton_v2.so.0.11.0"


# ------------------------------------------------------------------------------- the one reader --

@pytest.mark.parametrize("raw,words", [
    (b"[" * 100_000 + b"]" * 100_000, "this reach record is nested too deeply"),
    (b"{\"a\":" * 100_000, "this reach record is nested too deeply"),
    (b"\xff{}", "this reach record is not UTF-8 text (byte 0xff at offset 0)"),
    (b'{"mode": ', "this reach record is not valid JSON (EOF while parsing"),
    (b"[1, 2]", "not a reach record: expected a JSON object, found list"),
    (b'{"kernels_left_out": NaN}', "kernels_left_out: Input should be a valid integer"),
    (b'{"kernels_left_out": "6"}', "kernels_left_out: Input should be a valid integer"),
    (b'{"kernels_left_out": ' + b"7" * 5000 + b"}", "not valid JSON (number out of range"),
    (b'{"packages_left_out": [{"image": "a.aks2", "member": null, "kernels": 1, "x": 2}]}',
     "packages_left_out.0.x: unknown key"),
    (b'{"packages_left_out": "all"}', "packages_left_out: expected a list, found string"),
    (b'{"held": []}', "held: expected a mapping (JSON object), found list"),
    (b'{"kernels_left_out": 1, "kernels_left_out": 2}', "holds the key 'kernels_left_out' twice in one object"),
    (b'{"packages_left_out": [{"image": "a", "image": "b"}]}', "holds the key 'image' twice in one object"),
    (b'{"held": {"Q": 1, "Q": 1}}', "holds the key 'Q' twice in one object"),
])
def test_one_located_message_for_each_problem(tmp_path, raw, words):
    path = tmp_path / "reach.json"
    path.write_bytes(raw)
    with pytest.raises(RecordError) as exc:
        read_record(Reach, path, what="reach record", hint="fix it")
    assert exc.value.exit_code == EXIT_USER and str(exc.value).startswith(f"{path}: ")
    assert words in str(exc.value), str(exc.value)
    assert "\n" not in str(exc.value) and exc.value.hint == "fix it"


def test_what_comes_from_the_input_is_clipped_and_escaped(tmp_path):
    key = "k\x1b[31m" + "x" * 1_000_000
    with pytest.raises(RecordError) as exc:
        parse_record(Reach, json.dumps({key: 1}).encode(), where="R", what="reach record")
    msg = str(exc.value)
    assert len(msg) < 300 and "\x1b" not in msg and "\\x1b" in msg and "1,000,006 characters" in msg, msg


@pytest.mark.timeout(60)
def test_a_record_that_is_not_a_regular_file_is_one_message(tmp_path):
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, tmp_path / "absent.json"):
        with pytest.raises(RecordError) as exc:
            read_record(Reach, path, what="reach record")
        assert exc.value.kind == "read" and str(exc.value).startswith(f"{path}: ")


# --------------------------------------------------------------------------- bundle manifests --

def _bundle(path: Path, manifest: dict | bytes, members: dict[str, bytes] | None = None) -> Path:
    members = {LIB: b"lib"} if members is None else members
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(MANIFEST, manifest if isinstance(manifest, bytes) else json.dumps(manifest))
        for n, b in members.items():
            z.writestr(n, b)
    return path


def _with(**over) -> dict:
    m = minimal_manifest({LIB: b"lib"})
    m["library"]["needs"] = {"glibc": "GLIBC_2.17", "glibcxx": None}
    for k, v in over.items():
        if v is _DROP:
            del m[k]
        else:
            m[k] = v
    return m


_DROP = object()
BAD_MANIFESTS = {
    "hip_major six": (_with(hip_major="six"), "manifest.json: hip_major: Input should be a valid integer"),
    "hip_major NaN": (json.dumps(_with(hip_major=float("nan"))).encode(), "manifest.json: hip_major: Input should be"),
    "hip_major 5": (_with(hip_major=5), "manifest.json: hip_major: HIP 5 is not a major mi100-codegen builds for"),
    "hip_major true": (_with(hip_major=True), "manifest.json: hip_major: Input should be a valid integer"),
    "no arch": (_with(arch=_DROP), "manifest.json: arch: required field is missing"),
    "arch a path": (_with(arch="gfx90a/../../.."), "manifest.json: arch: 'gfx90a/../../..' is not an AMDGPU processor"),
    "arch unknown": (_with(arch="gfx9999"), "manifest.json: arch: 'gfx9999' is not an AMDGPU processor LLVM knows"),
    "arch 10 MB": (_with(arch="gfx908" * 1_750_000), "manifest.json: arch: String should have at most 16 characters"),
    "nested 100,000 deep": (b"[" * 100_000 + b"]" * 100_000, "manifest.json: this bundle manifest is nested too deeply"),
    "library a string": (_with(library="lib/x.so"), "manifest.json: library: expected a mapping (JSON object), found "
                                                    "string"),
    "library.needs a string": (_with(library={"file": LIB, "needs": "GLIBC_2.17"}),
                               "manifest.json: library.needs: expected a mapping"),
    "GLIBC_ and 5,000 digits": (_with(library={"file": LIB, "needs": {"glibc": "GLIBC_" + "9" * 5000}}),
                                "manifest.json: library.needs.glibc: String should have at most 40 characters"),
    "GLIBC_2.x": (_with(library={"file": LIB, "needs": {"glibc": "GLIBC_2.x"}}),
                  "manifest.json: library.needs.glibc: String should match pattern"),
    "label of 1 MB": (_with(label="x" * (1 << 20)), "manifest.json: label: String should have at most 200 characters"),
    "label with a newline": (_with(label="ok\nproblem: forged"), "manifest.json: label: 'ok\\nproblem: forged' holds a "
                                                                 "control character"),
    "unknown release": (_with(release="9.9b"), "manifest.json: release: '9.9b' is not a release mi100-codegen knows"),
    "relabelled version": (_with(version="0.13.0"), "manifest.json: version: 0.13.0 is not the version of release 0.11b"),
    "a member path out": (_with(files={"../lib.so": {"sha256": sha256(b"lib"), "size": 3}}),
                          "manifest.json: files.../lib.so: '../lib.so' has a '..' component"),
    "a library not listed": (_with(library={"file": "lib/other.so"}),
                             "manifest.json: library.file: 'lib/other.so' is not among the files the manifest lists"),
    "a size that is no count": (_with(files={LIB: {"sha256": sha256(b"lib"), "size": 3.0}}),
                                "manifest.json: files.lib/libaotriton_v2.so.0.11.0.size: Input should be a valid integer"),
    "an unknown key": (_with(planted={"x": 1}), "manifest.json: planted: unknown key"),
    "format 2": (_with(format=2), "manifest.json: format: Input should be 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_bundle_check_refuses_a_bad_manifest_with_one_located_message(tmp_path, monkeypatch, case):
    manifest, words = BAD_MANIFESTS[case]
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    b = _bundle(tmp_path / "b.mi100-bundle.zip", manifest)
    with pytest.raises(UserError) as exc:
        open_bundle(b)
    assert f"{b}: {words}" in str(exc.value), str(exc.value)
    r = cli("bundle", "check", str(b))
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert words.split(": ", 1)[1][:40] in r.output.replace("\n", " "), r.output
    assert not (tmp_path / "cache").exists()          # refused before the sysroot is fetched


def test_a_17_mib_manifest_is_refused_before_it_is_parsed(tmp_path):
    b = _bundle(tmp_path / "b.zip", _with(label="x" * (17 << 20)))
    with pytest.raises(UserError, match=r"manifest.json is larger than 16,777,216 bytes"):
        open_bundle(b)


@pytest.mark.parametrize("case", ["hip_major six", "hip_major NaN", "no arch", "nested 100,000 deep",
                                  "library a string", "library.needs a string", "arch 10 MB",
                                  "GLIBC_ and 5,000 digits", "arch a path", "label with a newline",
                                  "label of 1 MB"])
def test_torch_install_refuses_a_bad_manifest_and_touches_nothing(site, tmp_path, case):
    manifest, words = BAD_MANIFESTS[case]
    b = _bundle(tmp_path / "b.mi100-bundle.zip", manifest)
    before = snapshot(site)
    r = cli("torch", "install", "--bundle", str(b), "--torch-dir", str(site / "torch"))
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and words.split(": ", 1)[1][:40] in r.output.replace("\n", " "), r.output
    assert snapshot(site) == before


# ---------------------------------------------------------------------------- backup manifests --

def _installed(site, tmp_path) -> Path:
    from test_torch_install_bundle import make_bundle

    b = make_bundle(tmp_path)
    assert cli("torch", "install", "--bundle", str(b), "--torch-dir", str(site / "torch")).exit_code == 0
    return site / "torch.mi100-codegen-backup" / "manifest.json"


BAD_BACKUPS = {
    "bundle a string": (lambda m: {**m, "bundle": "b.zip"}, "bundle: expected a mapping (JSON object), found string"),
    "a label of 17 MiB": (lambda m: {**m, "bundle": {**m["bundle"], "label": "x" * (17 << 20)}},
                          "this backup manifest is larger than"),
    "a label of 1 MB": (lambda m: {**m, "bundle": {**m["bundle"], "label": "x" * (1 << 20)}},
                        "bundle.label: String should have at most 200 characters"),
    "hip_major six": (lambda m: {**m, "bundle": {**m["bundle"], "hip_major": "six"}},
                      "bundle.hip_major: Input should be a valid integer"),
    "arch a path": (lambda m: {**m, "arch": "gfx908/../../.."}, "arch: 'gfx908/../../..' is not an AMDGPU processor"),
    "nested 100,000 deep": (lambda m: "[" * 100_000 + "]" * 100_000, "this backup manifest is nested too deeply"),
    "an entry out of torch": (lambda m: {**m, "entries": m["entries"] + [{"path": "../x", "action": "add",
                                                                          "sha256_before": None,
                                                                          "sha256_after": "0" * 64}]},
                              "'../x' has a '..' component"),
}


@pytest.mark.parametrize("case", sorted(BAD_BACKUPS))
def test_a_bad_backup_manifest_is_one_message_for_restore_and_status(site, tmp_path, case):
    change, words = BAD_BACKUPS[case]
    path = _installed(site, tmp_path)
    doc = change(json.loads(path.read_text()))
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    before = snapshot(site)
    r = cli("torch", "restore", "--torch-dir", str(site / "torch"))
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "damaged backup manifest" in r.output and words[:40] in r.output.replace("\n", " "), r.output
    assert snapshot(site) == before
    r = cli("torch", "status", "--torch-dir", str(site / "torch"))
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    problems = [ln for ln in r.stdout.splitlines() if ln.startswith("problem:")]
    assert len(problems) == 1 and "damaged backup manifest" in problems[0], r.stdout


def test_the_backup_manifest_round_trips(site, tmp_path):
    from codegen.models.backup import BackupManifest
    from codegen.models.records import write_json

    path = _installed(site, tmp_path)
    m = read_record(BackupManifest, path, what="backup manifest")
    assert m.bundle.hip_major == 6 and m.bundle.arch == "gfx908" and m.entries
    assert write_json(m) == path.read_bytes()          # one writer, one reader, the same bytes


# ------------------------------------------------------------------------------ reach records --

@pytest.mark.parametrize("rel", ["mi100-codegen/reach.json"])
def test_deep_prefix_and_build_reach_records_are_one_message(tmp_path, rel):
    from codegen.imagebuild.reach import read_prefix_reach, read_reach

    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    for read in (read_reach, read_prefix_reach):
        with pytest.raises(UserError, match="reach.json: this reach record is nested too deeply") as exc:
            read(tmp_path)
        assert exc.value.hint and "--reconfigure" in exc.value.hint


# ----------------------------------------------------------------------- the writer's bytes --

def _writer_manifest() -> dict:
    """A manifest as `bundle build` writes it, made by its own function from stand-ins of what it
    reads (the build report, the library's ELF facts, the sysroot record, the checks' results)."""
    from codegen.imagebuild.prereq import Toolchain
    from codegen.imagebuild.verify import Verification
    from codegen.models.hip import SysrootRecord
    from codegen.ship.bundle import _manifest
    from codegen.ship.identity import Claim
    from codegen.ship.dispatch import DispatchReport
    from codegen.upstream import by_release

    files = {LIB: b"lib", "spec.yaml": b"arch: gfx908\n", "tuning-rows.json": b"{}",
             "lib/aotriton.images/amd-gfx908/flash/attn_fwd/FONLY__x.aks2": b"img"}
    reach = Reach(proven_by="v3src/flash/iface.op_attn_bwd.cc", fused_kernels=12, kernels_left_out=6,
                  held={"Q": "fp16", "BLOCK_DMODEL": "64", "PADDED_HEAD": "False"},
                  packages_left_out=[{"image": "amd-gfx908/flash/bwd_kernel_fuse/FONLY__y.aks2", "member": None,
                                      "kernels": 6, "functional": {"Q": "bf16", "BLOCK_DMODEL": "64"}}])
    toolchain = Toolchain(python="3.11.2", triton_version="3.5.1", cmake="cmake", cmake_version="3.31.6",
                          ninja="ninja", ninja_version="1.13.0", cxx="/usr/bin/g++", cc="/usr/bin/gcc", hip_dir=None,
                          hip_version=None)
    rep = SimpleNamespace(arch="gfx908", spec="mi100", spec_sha256="a" * 64, kernels_compiled=0, kernels_cached=3,
                          aiter=None, kernels="dispatched", reach=reach, log="/b/build-hip6/build.log",
                          toolchain=toolchain)
    dyn = SimpleNamespace(soname="libaotriton_v2.so.0.11", needed=["libamdhip64.so.6", "libc.so.6"], rpath=[],
                          runpath=["$ORIGIN"], import_versions=[("hipMalloc", "hip_4.2"), ("free", "GLIBC_2.2.5")],
                          highest=lambda f: {"GLIBC": "GLIBC_2.34", "GLIBCXX": "GLIBCXX_3.4.30"}[f])
    deb = {"version": "6.4.1-2", "file": "libamdhip64-dev_6.4.1-2_amd64.deb", "sha256": "b" * 64}
    sysroot = SimpleNamespace(record=SysrootRecord(format=2, major=6, suite="sid", packages={"libamdhip64-dev": deb},
                                                   runtime="usr/lib/x86_64-linux-gnu/libamdhip64.so.6.4.1"))
    kernels = Verification(library=LIB, kernels_referenced=9, kernels_packed=9, left_out=6, packages=4,
                           by_kernel={"attn_fwd": 9})
    data = _manifest(by_release("0.11b"), rep, 6, "gfx908:sramecc+:xnack-", Path(LIB), dyn, sysroot, kernels, files)
    data["built_with"]["images"] = "built by this build folder"
    data["compile_report"] = {"sha256": "c" * 64, "arch": "gfx908", "gpu": "gfx908_mod0", "release": "0.11b",
                              "triton": "3.5.1", "configs": 705, "verdicts": {"ok": 500, "spills": 205},
                              "kernels": 2310}
    claim = Claim("DT_NEEDED names the HIP runtime of its major", True, "needs libamdhip64.so.6")
    dispatch = DispatchReport(target="gfx908:sramecc+:xnack-", hip_major=6, check_gpu=0, cases=[], loads=12,
                              returncode=0)
    data["verified"] = {"where": "CPU-only machine", "link_identity": [claim.as_json()],
                        "dispatch": dispatch.summary(), "negative_controls": [claim.as_json()],
                        "tuning_rows": None, "forced_fused": claim.as_json()}
    return data, files


def test_the_manifest_written_through_the_model_is_byte_identical(tmp_path):
    data, files = _writer_manifest()
    before = json.dumps(data, indent=2, sort_keys=True) + "\n"   # how the writer wrote its dict
    dest = tmp_path / "b.mi100-bundle.zip"
    write_bundle(dest, manifest_of(data, str(dest)), files)
    assert zipfile.ZipFile(dest).read(MANIFEST).decode() == before
    b = open_bundle(dest)
    assert b.manifest.to_json() == data and b.manifest.built_with.reach.left_out[0].kernels == 6
    assert b.manifest.built_with.machine == platform.machine()


def test_the_writer_refuses_what_no_reader_would_read(tmp_path):
    data, files = _writer_manifest()
    data["arch"] = "gfx908/../.."
    with pytest.raises(RecordError, match=r"b.zip: arch: .gfx908/../... is not an AMDGPU processor"):
        manifest_of(data, "b.zip")


# ---------------------------------------------------------------- the records of our own folders --

@pytest.mark.parametrize("content", [b"[" * 100_000, b'{"fingerprint": 1}', b"\xff", b'{"fingerprint": "' + b"a" * 64
                                     + b'", "release": "0.11b", "cache": [["X", "BOOL", "ON", "4th"]], "knobs": []}'])
def test_a_configure_record_that_is_not_the_model_means_configure_again(tmp_path, content):
    from codegen.imagebuild.configure import SUPPORT_DIR, configured_fingerprint

    for name in ("CMakeCache.txt", "build.ninja"):
        (tmp_path / name).write_text("x")
    (tmp_path / SUPPORT_DIR).mkdir(parents=True)
    (tmp_path / SUPPORT_DIR / "configure.json").write_bytes(content)
    assert configured_fingerprint(tmp_path) is None


@pytest.mark.parametrize("output", [{"id": "x", "path": "../outside.txt", "sha256": "0" * 64, "template": "t"},
                                    {"id": "x", "path": "a.txt", "sha256": "0" * 64}])
def test_an_overlay_manifest_that_is_not_the_model_is_not_ours(tmp_path, output):
    from codegen.render.overlay_dir import _previous_outputs

    out = tmp_path / "overlay"
    out.mkdir()
    doc = {"toolkit": "mi100-codegen", "toolkit_version": "0", "spec_name": "s", "spec_sha256": "0" * 64,
           "layout": "v3", "outputs": [{"id": "y", "path": "b.txt", "sha256": "0" * 64, "template": "t"}], "edits": []}
    (out / "MANIFEST.json").write_text(json.dumps(doc))
    assert _previous_outputs(out) == {"b.txt": "0" * 64}
    doc["outputs"].append(output)
    (out / "MANIFEST.json").write_text(json.dumps(doc))
    assert _previous_outputs(out) is None
