"""Fuzzing the records we read (hypothesis), through their one reader (codegen.models.records):
JSON-level mutations (any JSON value anywhere, keys dropped or added, the document wrapped or
replaced) and byte-level ones (deep nesting, 5,000-digit numbers, inserted bytes, truncation) of

- a bundle manifest as `bundle build` writes it (read by `open_bundle`, which bundle check and
  torch install call),
- a torch backup manifest as `torch install` writes it (read by restore and status),
- a reach record (`BUILD/mi100-codegen/reach.json`, the prefix copy),
- a kernel-cache record (`CompileCache.get`: a record it cannot read is a miss, never an error),
- a bundle index (`codegen.ship.index.read_index`, what `torch install --bundle auto` fetches).

Each case ends in the model, or in one UserError (exit 2) whose one-line message starts with the
file it names; never another exception; nothing is written outside the case's folder.
Default run: 5 properties x 60 cases; `-m slow`: 5 x 1,000 (tests/fuzz_profiles.py)."""

from __future__ import annotations

import hashlib
import json
import tempfile
import zipfile
from pathlib import Path

import pytest
from fuzz_profiles import fast, slow
from hypothesis import given
from hypothesis import strategies as st

from codegen.core.errors import EXIT_USER, UserError
from codegen.formats.bundle_zip import MANIFEST, open_bundle
from codegen.models.bundle import BundleManifest
from codegen.models.reach import Reach
import test_kcache as kcache
from test_fuzz_data_files import _encode, _mutate
from test_records import _writer_manifest

WRITTEN, FILES = _writer_manifest()
BACKUP = {"schema": 1, "tool": "mi100-codegen torch install", "torch_version": "2.9.0+rocm6.4", "arch": "gfx908",
          "library": "lib/libaotriton_v2.so.0.11.0", "prefix_library": "libaotriton_v2.so.0.11.0",
          "bundle": {"file": "b.zip", "sha256": "a" * 64, "release": "0.11b", "arch": "gfx908", "hip_major": 6,
                     "label": "CPU-built", "spec_sha256": "b" * 64},
          "created_dirs": ["lib/aotriton.images/amd-gfx908"],
          "entries": [{"path": "lib/libaotriton_v2.so.0.11.0", "action": "replace", "sha256_before": "c" * 64,
                       "sha256_after": "d" * 64}]}
REACH = {"format": 2, "mode": "dispatched", "proven_by": "v3src/flash/iface.op_attn_bwd.cc", "reason": None,
         "fused_kernels": 12, "kernels_left_out": 6, "packages_left_out": WRITTEN["built_with"]["reach"]["left_out"],
         "held": WRITTEN["built_with"]["reach"]["held"]}
INDEX = {"format": 1, "bundles": [
    {"file": "aotriton-0.11b-gfx908-hip6.mi100-bundle.zip", "url": "aotriton-0.11b-gfx908-hip6.mi100-bundle.zip",
     "size": 123, "sha256": "b" * 64, "release": "0.11b", "version": "0.11.0", "arch": "gfx908",
     "target": "gfx908:sramecc+:xnack-", "hip_major": 6, "torch_lines": ["2.9"], "glibc": "GLIBC_2.34",
     "label": "CPU-built", "spec": {"name": "mi100", "sha256": "a" * 64},
     "provenance": {"project_version": "0.1.0", "spec_sha256": "a" * 64, "triton": "3.6.0", "builder": "local"}},
    {"file": "b.mi100-bundle.zip", "url": "https://example.com/b.mi100-bundle.zip", "size": 1, "sha256": "c" * 64,
     "release": "0.13b", "arch": "gfx1030", "hip_major": 7, "label": "x", "spec": {"sha256": "a" * 64},
     "provenance": {"spec_sha256": "a" * 64}}]}
CACHE_IDENT = kcache.ident(1)
CACHE = {**kcache.record(CACHE_IDENT), "format": 5, "key": CACHE_IDENT.key,
         "hsaco_sha256": hashlib.sha256(kcache.IMAGE).hexdigest()}


@st.composite
def documents(draw, doc):
    return _encode(draw, _mutate(draw, doc))


def _refused(exc: UserError, path: Path) -> None:
    assert exc.exit_code == EXIT_USER
    assert str(exc).startswith(str(path)) and "\n" not in str(exc), str(exc)


def _manifest_case(content: bytes):
    with tempfile.TemporaryDirectory() as d:
        b = Path(d) / "b.mi100-bundle.zip"
        with zipfile.ZipFile(b, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(MANIFEST, content)
            for n, data in FILES.items():
                z.writestr(n, data)
        bundle = None
        try:
            bundle = open_bundle(b)
        except UserError as exc:
            _refused(exc, b)
        else:
            assert isinstance(bundle.manifest, BundleManifest) and bundle.manifest.library.file in bundle.members
        assert sorted(p.name for p in Path(d).iterdir()) == [b.name]
        return bundle


def _backup_case(content: bytes):
    from codegen.ship.install import read_manifest

    with tempfile.TemporaryDirectory() as d:
        backup = Path(d) / "torch.mi100-codegen-backup"
        backup.mkdir()
        (backup / "manifest.json").write_bytes(content)
        try:
            m = read_manifest(backup)
        except UserError as exc:
            _refused(exc, backup / "manifest.json")
            return None
        assert all(not e.path.startswith(("/", "..")) for e in m.entries)
        return m


def _reach_case(content: bytes):
    from codegen.imagebuild.reach import REACH_FILE, read_reach

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / REACH_FILE
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
        try:
            reach = read_reach(Path(d))
        except UserError as exc:
            _refused(exc, path)
            return None
        assert isinstance(reach, Reach) and all(".." not in p.image.split("/") for p in reach.packages_left_out)
        return reach


def _cache_case(content: bytes):
    from codegen.compile.cache import CompileCache

    with tempfile.TemporaryDirectory() as d:
        c = CompileCache(Path(d))
        key = CACHE_IDENT.key
        (Path(d) / key[:2]).mkdir()
        (Path(d) / key[:2] / f"{key}.json").write_bytes(content)
        (Path(d) / key[:2] / f"{key}.hsaco").write_bytes(kcache.IMAGE)
        got = c.get(CACHE_IDENT)
        assert got is None or (got["key"] == key and got["ok"] is True and got["_hsaco"] == kcache.IMAGE)
        return got


def _index_case(content: bytes):
    from codegen.models.index import BundleIndex
    from codegen.ship.index import read_index

    where = "https://example.com/index.json"
    try:
        idx = read_index(content, where)
    except UserError as exc:
        assert exc.exit_code == EXIT_USER and str(exc).startswith(where) and "\n" not in str(exc), str(exc)
        return None
    assert isinstance(idx, BundleIndex)
    assert all(e.url.startswith("https://") or ".." not in e.url.split("/") for e in idx.bundles)
    return idx


CASES = {"manifest": (WRITTEN, _manifest_case), "index": (INDEX, _index_case), "backup": (BACKUP, _backup_case), "reach": (REACH, _reach_case),
         "cache": (CACHE, _cache_case)}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_fuzz_records(kind):
    doc, case = CASES[kind]

    @fast(60)
    @given(documents(doc))
    def run(content):
        case(content)

    run()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_fuzz_records_slow(kind):
    doc, case = CASES[kind]

    @slow(1000)
    @given(documents(doc))
    def run(content):
        case(content)

    run()


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_unchanged_record_is_accepted(kind):
    """The fuzzers start from records the readers accept (else every case would be a refusal)."""
    doc, case = CASES[kind]
    assert case(json.dumps(doc).encode()) is not None
