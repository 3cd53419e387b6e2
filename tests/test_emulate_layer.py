"""The emulator as a dependency and our layer's bookkeeping (issue 35 item 2): the pinned emulator
is found (an extracted tree, a git dir, the shared archive) and refused when it is another
commit or its archive another file; every part of our layer has a test that leaves it out and
fails (the instruction-level tests), and a write-up upstream could take. Cheap: no Triton."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.emulate import source
from codegen.emulate.arena import Arena
from codegen.emulate.machine import Machine
from codegen.emulate.parts import PARTS, PARTS_TABLE
from codegen.emulate.source import EmulatorMissing

REPO = Path(__file__).resolve().parents[1]


def test_every_part_of_the_layer_has_a_test_that_leaves_it_out():
    text = "".join(p.read_text(encoding="utf-8") for p in (REPO / "tests").glob("test_emulate*.py"))
    for name in PARTS:
        assert re.search(rf"""without=\(["']{name}["'],\)|machines\(\(["']{name}["'],\)\)""", text), name


def test_every_part_has_a_write_up():
    for p in PARTS_TABLE:
        assert p.where and len(p.wrong) > 40 and len(p.rule) > 30, p.name


def test_an_unknown_part_is_refused(tmp_path):
    with Arena.create(tmp_path / "a", 1 << 20) as arena, pytest.raises(ValueError, match="no part nonsense"):
        Machine("gfx908", arena, without=("nonsense",))


def test_a_tree_of_another_commit_is_refused(tmp_path, monkeypatch):
    (tmp_path / "test" / "mockgpu" / "amd").mkdir(parents=True)
    for rel in source.FILE_SHA256:
        (tmp_path / rel).write_text("# edited\n")
    monkeypatch.setenv(source.SRC_ENV, str(tmp_path))
    with pytest.raises(EmulatorMissing, match="not the one of tinygrad commit a9069c17"):
        source.emulator_root()


def test_an_archive_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "tinygrad-a9069c17.tar.xz"
    fake.write_bytes(b"not the archive")
    for env in (source.SRC_ENV, source.GIT_ENV):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv(source.ARCHIVE_ENV, str(fake))
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(EmulatorMissing, match="sha256"):
        source.emulator_root()
    monkeypatch.setenv(source.ARCHIVE_ENV, str(tmp_path / "absent.tar.xz"))
    with pytest.raises(EmulatorMissing, match="is not here") as info:
        source.emulator_root()
    assert source.SRC_ENV in info.value.hint and source.ARCHIVE_ENV in info.value.hint


def test_the_shared_archive_is_extracted_once_into_a_trusted_cache(tmp_path, monkeypatch):
    archive = source.find_archive([REPO])
    if archive is None:
        pytest.skip("no shared/emulators/ archive beside this checkout")
    for env in (source.SRC_ENV, source.GIT_ENV, source.ARCHIVE_ENV):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    root = source.emulator_root([REPO])
    assert root == tmp_path / "cache" / "emulator" / source.TOP and (root / "tinygrad").is_dir()
    assert source.emulator_root([REPO]) == root                    # the second time: the cached tree
    os.chmod(tmp_path / "cache" / "emulator", 0o777)
    from codegen.core.errors import UntrustedStorage
    with pytest.raises(UntrustedStorage):
        source.emulator_root([REPO])


def test_the_patch_notes_name_every_part():
    try:
        source.emulator_root()
    except EmulatorMissing as exc:
        pytest.skip(f"emulator: {exc}")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "emulator_patches.py")], capture_output=True,
                         text=True, check=True).stdout
    for name in PARTS:
        assert f"## {name}\n" in out
    assert "emu.py:" in out   # line numbers found in the pinned tree


def test_an_arch_without_a_layer_is_refused(tmp_path):
    with Arena.create(tmp_path / "a", 1 << 20) as arena, pytest.raises(EmulatorMissing, match="no emulator layer for gfx90a"):
        Machine("gfx90a", arena)
