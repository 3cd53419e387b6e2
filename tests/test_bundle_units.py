"""Fast unit tests of the bundle pieces that need no compiler: the validation cases of the
emulated dispatch, the image index (.aks2 packages and 0.13b's stored image zips) and the
missing-image control's removal, and the bundle reader's refusals (hostile members)."""

from __future__ import annotations

import io
import json
import lzma
import struct
import zipfile
from pathlib import Path

import pytest

from codegen.formats.bundle_zip import FORMAT, BundleError, extract, manifest_of, open_bundle, write_bundle
from codegen.core.fsutil import sha256
from codegen.formats.aks2 import read_aks2_images, read_zip_images
from codegen.formats.elf import elf_extent
from codegen.ship.dispatch import ImageIndex, dispatch_cases, fnv1a64, remove_image
from codegen.core.errors import UserError
from codegen.formats.spec import load_spec
from test_bundle_stub import code_object

REPO = Path(__file__).resolve().parents[1]


def test_dispatch_cases_of_the_smoke_spec():
    spec = load_spec(REPO / "rules" / "examples" / "smoke.yaml").spec
    cases = dispatch_cases(spec)
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) == 2 * 5 + 1 + 2
    assert any(c.shape.seqlen_q == 256 for c in cases)           # tile multiples
    assert any(c.shape.seqlen_q == 211 for c in cases)           # primes
    assert [c.causal for c in cases if c.bias] == [False]
    assert sorted(c.causal for c in cases if c.dropout) == [False, True]


def aks2(images: dict[str, bytes]) -> bytes:
    directory, blob, off = b"", b"", 0
    for name, img in images.items():
        n = name.encode() + b"\0"
        directory += struct.pack("<IIIII", 0, 256, off, len(img), len(n)) + n
        blob += img
        off += len(img)
    payload = directory + blob
    return struct.pack("<4sIII", b"AKS2", len(payload), len(images), len(directory)) + lzma.compress(payload)


def test_image_index_finds_what_the_stub_hashes(tmp_path):
    a, b = code_object(0x30, "attn_fwd"), code_object(0x30, "bwd_kernel_dq", kernarg=128)
    pkg = tmp_path / "amd-gfx908" / "flash" / "attn_fwd" / "FONLY.aks2"
    pkg.parent.mkdir(parents=True)
    pkg.write_bytes(aks2({"k1": a + b"\0" * 8, "k2": b}))        # padding past the ELF is not hashed
    assert read_aks2_images(pkg)["k2"] == b
    assert elf_extent(a + b"\0" * 8) == len(a)
    idx = ImageIndex(tmp_path)
    assert idx.find(len(a), fnv1a64(a)) == "amd-gfx908/flash/attn_fwd/FONLY/k1"
    assert idx.find(len(b), fnv1a64(b)) == "amd-gfx908/flash/attn_fwd/FONLY/k2"
    assert idx.find(len(b), "0" * 16) is None
    assert fnv1a64(b"") == "cbf29ce484222325"                   # the FNV-1a 64 offset basis


def test_image_index_reads_0_13b_zips_and_removes_one_image(tmp_path):
    """0.13b: `<pack>/flash/<kernel>.zip`, stored, one .aks2 cluster per functional member, beside
    a 0.11b-style .aks2 package; the index names each kernel and its container, and the
    missing-image control takes out exactly that container (the zip keeps its other members)."""
    a, b, c = (code_object(0x30, "attn_fwd"), code_object(0x30, "attn_fwd", kernarg=128),
               code_object(0x30, "bwd_kernel_dq", kernarg=96))
    images = tmp_path / "aotriton.images"
    z = images / "amd-gfx908" / "flash" / "attn_fwd.zip"
    z.parent.mkdir(parents=True)
    with zipfile.ZipFile(z, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("FONLY__fp16_F.aks2", aks2({"k1": a}))
        zf.writestr("FONLY__fp16_T.aks2", aks2({"k2": b}))
        zf.writestr("README", b"not a package")
    pkg = images / "amd-gfx908" / "flash" / "bwd_kernel_dq" / "FONLY.aks2"
    pkg.parent.mkdir(parents=True)
    pkg.write_bytes(aks2({"k3": c}))
    assert set(read_zip_images(z)) == {"FONLY__fp16_F.aks2", "FONLY__fp16_T.aks2"}
    idx = ImageIndex(images)
    ka, kb, kc = (idx.find(len(x), fnv1a64(x)) for x in (a, b, c))
    assert ka == "amd-gfx908/flash/attn_fwd/FONLY__fp16_F/k1" and kb == "amd-gfx908/flash/attn_fwd/FONLY__fp16_T/k2"
    assert kc == "amd-gfx908/flash/bwd_kernel_dq/FONLY/k3"
    assert idx.container(ka) == "amd-gfx908/flash/attn_fwd.zip:FONLY__fp16_F.aks2"
    assert idx.container(kc) == "amd-gfx908/flash/bwd_kernel_dq/FONLY.aks2"
    remove_image(images, idx.container(ka))
    with zipfile.ZipFile(z) as zf:
        assert zf.namelist() == ["FONLY__fp16_T.aks2", "README"]
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist()) and zf.testzip() is None
    after = ImageIndex(images)
    assert after.find(len(a), fnv1a64(a)) is None and after.find(len(b), fnv1a64(b)) == kb
    remove_image(images, idx.container(kc))
    assert not pkg.exists() and ImageIndex(images).find(len(c), fnv1a64(c)) is None
    z.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(UserError, match="not a readable image zip"):
        ImageIndex(images)


def minimal_manifest(listed: dict[str, bytes], library: str | None = None, **over) -> dict:
    """The fields every bundle manifest has (codegen.models.bundle), for `listed` members."""
    return {"format": FORMAT, "label": "CPU-built, dispatch emulated; never run on a card", "release": "0.11b",
            "arch": "gfx908", "hip_major": 6, "spec": {"sha256": "0" * 64},
            "library": {"file": library or next(iter(listed), "lib/x")},
            "files": {n: {"sha256": sha256(b), "size": len(b)} for n, b in listed.items()}, **over}


def _raw_bundle(path: Path, members: dict[str, bytes], listed: dict[str, bytes] | None = None,
                manifest: dict | bytes | None = None) -> Path:
    listed = members if listed is None else listed
    manifest = minimal_manifest(listed) if manifest is None else manifest
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("manifest.json", manifest if isinstance(manifest, bytes) else json.dumps(manifest))
        for n, b in members.items():
            z.writestr(n, b)
    return path


def test_reader_refusals(tmp_path):
    ok = _raw_bundle(tmp_path / "ok.zip", {"lib/libaotriton_v2.so.0.11.0": b"x"})
    b = open_bundle(ok)
    root = extract(b, tmp_path / "out")
    assert (root / "lib" / "libaotriton_v2.so.0.11.0").read_bytes() == b"x"
    cases = {
        "dotdot": ({"lib/a": b"x", "../evil": b"y"}, None, "'..' component"),
        "absolute": ({"lib/a": b"x", "/etc/evil": b"y"}, None, "absolute path"),
        "git": ({"lib/a": b"x", ".git/config": b"y"}, None, "never ours to change"),
        "unlisted": ({"lib/a": b"x", "lib/b": b"y"}, {"lib/a": b"x"}, "not listed: lib/b"),
        "missing": ({"lib/a": b"x"}, {"lib/a": b"x", "lib/b": b"y"}, "missing: lib/b"),
        "changed": ({"lib/a": b"z"}, {"lib/a": b"x"}, "does not match the manifest"),
    }
    for name, (members, listed, words) in cases.items():
        with pytest.raises(BundleError, match=words.replace("(", r"\(")):
            open_bundle(_raw_bundle(tmp_path / f"{name}.zip", members, listed))
    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as z:
        info = zipfile.ZipInfo("lib/a")
        info.external_attr = (0o120777) << 16
        z.writestr(info, "/etc/passwd")
        z.writestr("manifest.json", "{}")
    with pytest.raises(BundleError, match="not a regular file"):
        open_bundle(link)
    (tmp_path / "junk.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(BundleError, match="truncated"):
        open_bundle(tmp_path / "junk.zip")


def test_writer_is_atomic_and_readable(tmp_path):
    dest = tmp_path / "b.zip"
    files = {"lib/libaotriton_v2.so.0.11.0": b"lib", "lib/aotriton.images/amd-gfx908/flash/x.aks2": b"img"}
    write_bundle(dest, manifest_of(minimal_manifest(files, "lib/libaotriton_v2.so.0.11.0"), "b.zip"), files)
    assert sorted(open_bundle(dest).members) == sorted(files)
    assert [p.name for p in tmp_path.iterdir()] == ["b.zip"]


def test_cli_refusals_are_one_message(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from codegen.cli import app

    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    junk = tmp_path / "x.mi100-bundle.zip"
    junk.write_bytes(b"not a zip")
    r = CliRunner().invoke(app, ["bundle", "check", str(junk)])
    assert r.exit_code == 2 and "not a bundle or a truncated one" in r.output and "Traceback" not in r.output


def test_bad_carried_rows_are_one_message_before_any_work(tmp_path, monkeypatch):
    """A bundle whose tuning-rows.json is no rows member (listed with its sha256, so integrity
    passes): `bundle check` refuses it, exit 2, one message, before the HIP sysroot is fetched."""
    from typer.testing import CliRunner

    from codegen.cli import app

    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    b = _raw_bundle(tmp_path / "b.mi100-bundle.zip", {"lib/libaotriton_v2.so.0.11.0": b"x",
                                                       "tuning-rows.json": b'{"format": 1, "gpus": []}'})
    r = CliRunner().invoke(app, ["bundle", "check", str(b)])
    assert r.exit_code == 2 and "tuning-rows.json: not the tuning rows of a bundle (gpus" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "cache").exists()


def test_add_rows_refuses_a_tree_the_bundle_was_not_built_from(tmp_path):
    from codegen.ship.bundle import add_rows

    b = _raw_bundle(tmp_path / "b.mi100-bundle.zip", {"lib/libaotriton_v2.so.0.11.0": b"x"})
    (tmp_path / "tree").mkdir()
    with pytest.raises(UserError, match="not the applied tree b.mi100-bundle.zip was built from"):
        add_rows(b, tmp_path / "tree", tmp_path / "out.zip")
    assert not (tmp_path / "out.zip").exists()


@pytest.mark.aotriton
def test_bundle_build_refuses_an_unapplied_tree_before_fetching(pristine_tree, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from codegen.cli import app

    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(app, ["bundle", "build", str(pristine_tree("0.11b")), "--hip", "6", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "overlay is not applied" in r.output, r.output
    assert not (tmp_path / "cache").exists() and not (tmp_path / "o").exists()


@pytest.mark.aotriton
def test_the_manifest_summarises_the_compile_report_of_the_tree(fresh_tree):
    """`compile_report` in a bundle's manifest: the report render used for the tree's recorded
    spec (here the shipped tuning/gfx908/compile_report.json), counted independently."""
    from collections import Counter

    from typer.testing import CliRunner

    from codegen.apply.applied_spec import resolve_spec
    from codegen.ship.bundle import _compile_report
    from codegen.cli import app
    from conftest import REPO

    tree = fresh_tree("0.11b")
    assert CliRunner().invoke(app, ["apply", str(tree)]).exit_code == 0
    got = _compile_report(resolve_spec(tree, None))
    shipped = REPO / "tuning" / "gfx908" / "compile_report.json"
    want = json.loads(shipped.read_text())
    assert got["sha256"] == sha256(shipped.read_bytes())
    assert (got["arch"], got["triton"], got["configs"]) == (want["arch"], want["triton"], len(want["configs"]))
    assert got["verdicts"] == dict(Counter(c["verdict"] for c in want["configs"].values()))


@pytest.mark.aotriton
def test_bundle_build_checks_its_outputs_before_any_work(fresh_tree, tmp_path):
    """`--out`, `--build-dir` and `--cache-dir` that cannot be written: exit 2, one message, before
    the sysroot, the build venv or the build folder (the same checks as `build`'s)."""
    from typer.testing import CliRunner

    from codegen.cli import app

    tree = fresh_tree("0.11b")
    assert CliRunner().invoke(app, ["apply", str(tree)]).exit_code == 0
    afile = tmp_path / "a-file"
    afile.write_text("x")
    for opt in ("--out", "--build-dir", "--cache-dir"):
        r = CliRunner().invoke(app, ["bundle", "build", str(tree), "--hip", "6", opt, str(afile)])
        assert r.exit_code == 2 and f"{opt} {afile}: is a file" in r.output and "Traceback" not in r.output, r.output
    assert not (tree / "build-hip6").exists() and afile.read_text() == "x"


@pytest.mark.aotriton
def test_bundle_build_resolves_the_spec_and_renders_the_overlay_once(fresh_tree, tmp_path, monkeypatch):
    """`bundle build` checks the tree before fetching the sysroot and hands those checks to the
    build stage: one spec resolution, one render (before, each ran twice)."""
    from types import SimpleNamespace

    from rich.console import Console

    from codegen.imagebuild import builder
    from codegen.ship import bundle
    from codegen.cli import app
    from typer.testing import CliRunner

    tree = fresh_tree("0.11b")
    assert CliRunner().invoke(app, ["apply", str(tree)]).exit_code == 0
    calls = {"resolve": 0, "render": 0}

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapper

    class Stop(Exception):
        pass

    def stop(*_a, **_k):
        raise Stop

    monkeypatch.setattr(builder, "resolve_spec", counted("resolve", builder.resolve_spec))
    monkeypatch.setattr(builder, "render_overlay", counted("render", builder.render_overlay))
    monkeypatch.setattr(bundle, "ensure_sysroot", lambda hip, progress: SimpleNamespace(prefix=tmp_path / "sysroot"))
    monkeypatch.setattr(builder, "check_prerequisites", stop)  # the build's first step after its checks
    with pytest.raises(Stop):
        bundle.build_bundle(tree, 6, spec_path=None, out_dir=tmp_path / "o", images=None, build_dir=None, jobs=1,
                            console=Console(file=io.StringIO()), progress=lambda _m: None)
    assert calls == {"resolve": 1, "render": 1}
