"""The bundle index (issue 31 item 3): `bundle index DIR` over well-formed bundles whose library is
a real ELF file linked against a HIP runtime (the fixtures of test_torch_hip_runtime.py, made into
bundles by the bundle writer as test_torch_install_bundle.py does); a bundle that fails its
checks refuses the whole index; hostile index documents are one located message; the choice of
an entry; where an index and its bundles are."""

from __future__ import annotations

import importlib.util
import json
import os
import zipfile
from pathlib import Path

import pytest

from codegen.core.contain import Escape
from codegen.core.errors import UserError
from codegen.formats.bundle_zip import bundle_name, manifest_of, open_bundle, write_bundle
from codegen.core.fsutil import sha256
from codegen.models.index import INDEX_LIMIT, BundleIndex
from codegen.models.records import RecordError
from codegen.ship.index import (DEFAULT_INDEX_URL, INDEX_ENV, entry_differences, entry_of, index_json_schema,
                                index_location, index_source, read_index, read_index_file, select_bundle,
                                write_index)
from codegen.ship.layout import TORCH_LINES

from conftest import REPO
from test_torch_install_bundle import make_bundle as make_install_bundle
from test_torch_install import cli, need_cc

COMMIT = "1234567890abcdef1234567890abcdef12345678"


def make_bundle(out_dir: Path, work: Path, arch: str = "gfx908", hip: int = 6) -> Path:
    """A bundle of AOTriton 0.11b for `arch` and HIP `hip` with the provenance `bundle build` records."""
    return make_install_bundle(work, arch, hip=hip, out_dir=out_dir, version="0.11.0", torch_lines=["2.9", "2.10"],
                               spec={"name": "smoke", "sha256": "a" * 64},
                               built_with={"project": {"version": "0.1.0", "commit": COMMIT, "modified": False},
                                           "builder": "test", "toolchain": {"triton": "3.6.0"}})


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> Path:
    """A folder of three bundles (gfx908 HIP 6 and 7, gfx906 HIP 6)."""
    need_cc()
    base = tmp_path_factory.mktemp("bundles")
    for arch, hip in (("gfx908", 7), ("gfx906", 6), ("gfx908", 6)):
        make_bundle(base / "dist", base / "work", arch, hip)
    return base / "dist"


def _copy(src: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for p in src.glob("*.mi100-bundle.zip"):
        (dest / p.name).write_bytes(p.read_bytes())
    return dest


def test_index_lists_every_bundle_from_its_manifest(bundles, tmp_path):
    folder = _copy(bundles, tmp_path / "d")
    r = cli("bundle", "index", str(folder), "--json")
    assert r.exit_code == 0, r.output
    raw = (folder / "index.json").read_bytes()
    assert json.loads(r.stdout) == json.loads(raw)
    idx = read_index(raw, "index.json")
    assert [e.key for e in idx.bundles] == [("0.11b", "gfx906", 6), ("0.11b", "gfx908", 6), ("0.11b", "gfx908", 7)]
    for e in idx.bundles:
        data = (folder / e.file).read_bytes()
        assert e.url == e.file and e.size == len(data) and e.sha256 == sha256(data)
        assert e.torch_lines == ["2.9", "2.10"] and e.glibc.startswith("GLIBC_2.") and e.version == "0.11.0"
        assert e.provenance.project_commit == COMMIT and e.provenance.triton == "3.6.0"
        assert e.provenance.builder == "test" and e.provenance.spec_sha256 == "a" * 64
        assert e.spec.name == "smoke" and e.provenance.project_modified is False
        assert index_location(str(folder)).bundle(e) == folder.resolve() / e.file
    # deterministic: the same bytes again, the file untouched
    mtime = (folder / "index.json").stat().st_mtime_ns
    _, again, changed = write_index(folder)
    assert not changed and again == idx and (folder / "index.json").read_bytes() == raw
    assert (folder / "index.json").stat().st_mtime_ns == mtime
    assert raw.endswith(b"}\n") and b"\r" not in raw and raw == json.dumps(json.loads(raw), indent=2,
                                                                           sort_keys=True).encode() + b"\n"
    # an entry derived from the bundle as the reader opens it is the entry listed
    first = open_bundle(folder / idx.bundles[0].file)
    assert entry_of(first) == idx.bundles[0] and entry_differences(first, idx.bundles[0]) == []
    lie = idx.bundles[0].model_copy(update={"hip_major": 7, "release": "0.11.1b"})
    assert entry_differences(first, lie) == ["hip_major: the index says 7, the bundle 6",
                                             "release: the index says 0.11.1b, the bundle 0.11b"]


def _refused(folder: Path, *words: str) -> str:
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    r = cli("bundle", "index", str(folder))
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    for w in words:
        assert w in r.output, (w, r.output)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before   # nothing written
    return r.output


def test_a_bad_bundle_refuses_the_index_with_one_message(bundles, tmp_path):
    folder = _copy(bundles, tmp_path / "tampered")
    (folder / "index.json").write_text('{"format": 1, "bundles": []}\n')   # an older index stays as it was
    victim = folder / bundle_name("0.11b", "gfx906", 6)
    with zipfile.ZipFile(victim, "a") as z:
        z.writestr("lib/extra.so", b"not listed")
    out = _refused(folder, "1 of 3 bundles cannot be listed", victim.name, "not listed")

    folder = _copy(bundles, tmp_path / "renamed")
    os.rename(folder / bundle_name("0.11b", "gfx908", 7), folder / "aotriton-0.11b-gfx908-hip6x.mi100-bundle.zip")
    _refused(folder, "the file is aotriton-0.11b-gfx908-hip7.mi100-bundle.zip")

    folder = _copy(bundles, tmp_path / "linked")
    (folder / "elsewhere.mi100-bundle.zip").symlink_to(bundles / bundle_name("0.11b", "gfx906", 6))
    _refused(folder, "not a regular file")

    folder = tmp_path / "foreign"
    folder.mkdir()
    (folder / "x.mi100-bundle.zip").write_bytes(b"PK\x03\x04 not a zip")
    _refused(folder, "not a bundle or a truncated one")
    (tmp_path / "empty").mkdir()
    _refused(tmp_path / "empty", "no *.mi100-bundle.zip files")
    assert out.count("Error") <= 1


def test_a_library_that_is_not_what_its_manifest_says_is_refused(tmp_path):
    """A manifest claiming HIP 7 over a library linked against HIP 6: the identity checks of
    `bundle check` refuse it."""
    need_cc()
    good = make_bundle(tmp_path / "a", tmp_path / "w", "gfx908", 6)
    b = open_bundle(good)
    lying = tmp_path / "d" / bundle_name("0.11b", "gfx908", 7)
    lying.parent.mkdir()
    write_bundle(lying, manifest_of(dict(b.manifest.to_json(), hip_major=7), str(lying)), b.members)
    _refused(lying.parent, "DT_NEEDED names the HIP runtime of its major")


def test_a_bundle_the_verdict_refuses_is_not_listed(tmp_path):
    """The index lists only what bundle check and torch install accept (codegen.ship.verdict): a
    second AOTriton library, re-signed into the manifest, is named and no index is written."""
    from test_torch_install_bundle import _resigned, _second_library

    need_cc()
    folder = tmp_path / "d"
    _resigned(make_bundle(folder, tmp_path / "w", "gfx908", 6), _second_library)
    _refused(folder, "one AOTriton library, the one the manifest names (lib/ holds libaotriton_v2.so.0.11.0, "
                     "libaotriton_v2.so.0.11.1")
    assert not (folder / "index.json").exists()


# --- hostile index documents ----------------------------------------------------------------------
ENTRY = {"file": "aotriton-0.11b-gfx908-hip6.mi100-bundle.zip", "url": "aotriton-0.11b-gfx908-hip6.mi100-bundle.zip",
         "size": 10, "sha256": "b" * 64, "release": "0.11b", "arch": "gfx908", "hip_major": 6,
         "label": "x", "spec": {"sha256": "a" * 64}, "provenance": {"spec_sha256": "a" * 64}}


def _doc(*entries: dict, **top) -> bytes:
    return json.dumps({"format": 1, "bundles": list(entries), **top}).encode()


@pytest.mark.parametrize("raw, words", [
    (b"\xff\xfe", "not UTF-8"),
    (b"{", "not valid JSON"),
    (b"[1, 2]", "expected a JSON object, found list"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b" " * (INDEX_LIMIT + 1), "larger than"),
    (json.dumps({"format": 2, "bundles": []}).encode(), "bundle index format 2"),
    (json.dumps({"format": "1", "bundles": []}).encode(), "format:"),
    (json.dumps({"bundles": []}).encode(), "format: required field is missing"),
    (_doc(dict(ENTRY, size="10")), "bundles.0.size"),
    (_doc(dict(ENTRY, size=1.5)), "bundles.0.size"),
    (_doc(dict(ENTRY, hip_major=True)), "bundles.0.hip_major"),
    (_doc(dict(ENTRY, sha256="B" * 64)), "bundles.0.sha256"),
    (_doc(dict(ENTRY, url="../aotriton.mi100-bundle.zip")), "must stay below the index's folder"),
    (_doc(dict(ENTRY, url="/etc/passwd")), "absolute path"),
    (_doc(dict(ENTRY, url="http://example.com/b.zip")), "must be https://"),
    (_doc(dict(ENTRY, url="file:///etc/passwd")), "must be https://"),
    (_doc(dict(ENTRY, url="javascript:alert(1)")), "must be https://"),
    (_doc(dict(ENTRY, url="//example.com/b.zip")), "must be https://"),
    (_doc(dict(ENTRY, url="https://user:pw@example.com/b.zip")), "no user or password"),
    (_doc(dict(ENTRY, url="https:///b.zip")), "names a host"),
    (_doc(dict(ENTRY, url="a%2F..%2Fb.zip")), "letters, digits"),
    (_doc(dict(ENTRY, url="b.zip?x=1")), "letters, digits"),
    (_doc(dict(ENTRY, url="https://example.com/\x1b[2Jb.zip")), "control character"),
    (_doc(dict(ENTRY, url="x" * 5000)), "longer than 2048"),
    (_doc(dict(ENTRY, file="../x.mi100-bundle.zip")), "bundles.0.file"),
    (_doc(dict(ENTRY, arch="../../etc")), "bundles.0.arch"),
    (_doc(dict(ENTRY, extra=1)), "bundles.0.extra: unknown key"),
    (_doc(ENTRY, ENTRY), "listed twice"),
    (_doc(ENTRY, dict(ENTRY, file="other.mi100-bundle.zip")), "two entries for AOTriton 0.11b, gfx908, HIP 6"),
    (_doc(*[dict(ENTRY, file=f"b{i}.mi100-bundle.zip", hip_major=1 + i % 900, release=f"0.{i}b")
            for i in range(4097)]), "bundles: List should have at most 4096 items"),
])
def test_hostile_index_documents_are_one_located_message(raw, words):
    with pytest.raises(RecordError) as err:
        read_index(raw, "https://example.com/index.json")
    msg = str(err.value)
    assert words in msg, msg
    assert msg.startswith("https://example.com/index.json: ") and "\n" not in msg and "\x1b" not in msg
    assert len(msg) < 800


def test_hostile_index_through_the_cli_is_exit_2_without_traceback(tmp_path, monkeypatch):
    """The error path every command shares: a RecordError is one message, exit 2."""
    from codegen.cli import app
    from typer.testing import CliRunner

    bad = tmp_path / "index.json"
    bad.write_bytes(_doc(dict(ENTRY, url="../../x.mi100-bundle.zip")))
    with pytest.raises(RecordError):
        read_index_file(bad)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(RecordError, match="FIFO"):
        read_index_file(fifo)
    assert CliRunner().invoke(app, ["bundle", "index", str(bad)]).exit_code == 2   # a file, not a folder


def test_an_index_from_a_newer_writer_is_read_and_unknown_entries_are_never_chosen():
    idx = read_index(_doc(ENTRY, dict(ENTRY, file="n.mi100-bundle.zip", release="0.19b", hip_major=9),
                          dict(ENTRY, file="m.mi100-bundle.zip", release="0.11b", hip_major=7)), "i")
    assert [e.release for e in idx.bundles] == ["0.11b", "0.19b", "0.11b"]
    assert select_bundle(idx, release="0.11b", arch="gfx908", hip_major=6).entry.file == ENTRY["file"]
    assert select_bundle(idx, release="0.11b", arch="gfx908", hip_major=9).entry is None
    c = select_bundle(idx, release="0.11.1b", arch="gfx908", hip_major=6)
    assert c.entry.release == "0.11b" and not c.exact


# --- choosing --------------------------------------------------------------------------------------
def _index(*keys: tuple[str, str, int]) -> BundleIndex:
    return read_index(_doc(*[dict(ENTRY, file=f"aotriton-{r}-{a}-hip{h}.mi100-bundle.zip", release=r, arch=a,
                                  hip_major=h, url=f"aotriton-{r}-{a}-hip{h}.mi100-bundle.zip")
                             for r, a, h in keys]), "i")


def test_select_prefers_the_release_then_the_newest_of_its_line():
    idx = _index(("0.11b", "gfx908", 6), ("0.11.1b", "gfx908", 7), ("0.11.2b", "gfx908", 7), ("0.13b", "gfx908", 7),
                 ("0.11b", "gfx906", 6), ("0.12b", "gfx1030", 7))
    c = select_bundle(idx, release="0.11.1b", arch="gfx908", hip_major=7)
    assert (c.entry.release, c.exact) == ("0.11.1b", True)
    c = select_bundle(idx, release="0.11b", arch="gfx908", hip_major=7)   # torch 2.9 on a HIP 7 build
    assert (c.entry.release, c.exact) == ("0.11.2b", False)
    c = select_bundle(idx, release="0.11", arch="gfx908", hip_major=6)    # a line
    assert c.entry.release == "0.11b"
    c = select_bundle(idx, release="0.12b", arch="gfx908", hip_major=7)
    assert c.entry is None and {e.release for e in c.others} == {"0.11b", "0.11.1b", "0.11.2b", "0.13b"}
    c = select_bundle(idx, release="0.11b", arch="gfx906", hip_major=7)
    assert c.entry is None and [e.key for e in c.others] == [("0.11b", "gfx906", 6)]
    assert select_bundle(idx, release="0.12.1b", arch="gfx1030", hip_major=7).entry.release == "0.12b"
    assert select_bundle(idx, release="main", arch="gfx908", hip_major=7).entry is None


# --- where -----------------------------------------------------------------------------------------
def test_index_location_and_source(tmp_path, monkeypatch):
    monkeypatch.delenv(INDEX_ENV, raising=False)
    assert index_source(None) == (DEFAULT_INDEX_URL, "the published index")
    monkeypatch.setenv(INDEX_ENV, str(tmp_path))
    assert index_source(None) == (str(tmp_path), f"${INDEX_ENV}")
    assert index_source("https://h/x") == ("https://h/x", "--index")

    e = read_index(_doc(ENTRY, dict(ENTRY, file="abs.mi100-bundle.zip", release="0.12b",
                                    url="https://cdn.example.com/b/abs.mi100-bundle.zip")), "i").bundles
    loc = index_location("https://example.com/releases/download/v1/")
    assert loc.document == "https://example.com/releases/download/v1/index.json" and loc.is_url
    assert loc.bundle(e[0]) == "https://example.com/releases/download/v1/" + ENTRY["url"]
    assert loc.bundle(e[1]) == "https://cdn.example.com/b/abs.mi100-bundle.zip"
    loc = index_location("https://example.com/a/bundles.json")
    assert loc.document == "https://example.com/a/bundles.json" and loc.bundle(e[0]) == f"https://example.com/a/{ENTRY['url']}"
    assert index_location("http://127.0.0.1:8123").document == "http://127.0.0.1:8123/index.json"
    assert index_location("http://[::1]:8123/i.json").document == "http://[::1]:8123/i.json"
    for bad in ("http://example.com/index.json", "file:///etc/index.json", "ftp://h/i.json",
                "https://u:p@h/i.json", "https://h/i.json?x=1", "https://h:99999/i.json"):
        with pytest.raises(UserError):
            index_location(bad)
    loc = index_location(str(tmp_path))
    assert loc.document == str(tmp_path.resolve() / "index.json") and not loc.is_url
    assert loc.bundle(e[0]) == tmp_path.resolve() / ENTRY["url"]
    (tmp_path / "sub").symlink_to("/")
    deep = read_index(_doc(dict(ENTRY, url="sub/etc/passwd")), "i").bundles[0]
    with pytest.raises(Escape):
        loc.bundle(deep)
    assert index_location(str(tmp_path / "index.json")).folder == tmp_path.resolve()


def test_the_json_schema_is_the_models_and_in_the_reference():
    schema = index_json_schema()
    assert schema["properties"]["format"]["const"] == 1
    assert "IndexEntry" in schema["$defs"] and "provenance" in schema["$defs"]["IndexEntry"]["properties"]
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "scripts" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.GENERATORS["index"]()
    assert "`hip_major`" in page and "`provenance`" in page and "`sha256`" in page


def test_torch_lines_name_their_wheels_rocm():
    """The HIP majors of each torch line: the majors of its wheels' ROCm versions."""
    for t in TORCH_LINES:
        assert t.rocm and t.hip_majors == tuple(sorted({int(v.split(".")[0]) for v in t.rocm}))
    assert {t.torch: t.hip_majors for t in TORCH_LINES}["2.9"] == (6,)
    assert {t.torch: t.hip_majors for t in TORCH_LINES}["2.10"] == (7,)


def test_bundle_build_records_its_provenance(monkeypatch):
    """What `bundle build` writes into `built_with` (the index's provenance): this checkout's commit."""
    from codegen import __version__
    from codegen.ship.bundle import project_provenance

    p = project_provenance()
    assert p["version"] == __version__
    if (REPO / ".git").exists():
        import subprocess

        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert p["commit"] == head.strip() and isinstance(p["modified"], bool)


def test_the_bundles_page_quotes_the_wheels_rocm_of_the_records():
    """docs/bundles.md's table: the ROCm versions of each torch line are the records' (`TorchLine.rocm`)."""
    text = (REPO / "docs" / "bundles.md").read_text(encoding="utf-8")
    rocm = {t.torch: t.rocm for t in TORCH_LINES}
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| 2.")]
    assert rows
    for lines, cell in rows:
        for torch in lines.replace("/ main", "").split(","):
            assert tuple(v.strip() for v in cell.split("(")[0].split(",")) == rocm[torch.strip()], (torch, cell)


def test_an_index_that_cannot_be_written_is_one_message(bundles, tmp_path):
    folder = _copy(bundles, tmp_path / "ro")
    (folder / "index.json").mkdir()   # in the way: not replaceable by a file
    r = cli("bundle", "index", str(folder))
    assert r.exit_code in (2, 3) and "cannot write it" in r.output and "Traceback" not in r.output
