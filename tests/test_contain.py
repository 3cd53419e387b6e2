"""The containment rule (codegen.core.contain) and the input reader (codegen.core.fsutil.read_input)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, strategies as st

from codegen.core.contain import Escape, inside, is_rel_path, perm_bits, rel_path
from codegen.core.errors import UserError
from codegen.core.fsutil import read_input


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "a\\b", "a\nb",
                                 "a\x00b", ".git/config", "x/.git/HEAD"])
def test_rel_path_refuses(bad):
    with pytest.raises(ValueError):
        rel_path(bad, (".git",))
    assert not is_rel_path(bad) or ".git" in bad


@pytest.mark.parametrize("good", ["a", "a/b.py", ".mi100-codegen/backup/v3src/util.cc", "x..y/z"])
def test_rel_path_accepts(good):
    assert rel_path(good) == good


def test_inside_refuses_links_and_files_on_the_way(tmp_path):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "f").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "out")
    os.symlink("d", root / "in")
    assert inside(root, "d/new") == root / "d" / "new"
    assert inside(root, "missing/deeper/x") == root / "missing" / "deeper" / "x"
    for rel in ("out/x", "in/x", "f/x", "out", "../outside/x", str(outside / "x")):
        with pytest.raises(Escape):
            inside(root, rel)
    assert inside(root, "out", final_link=True) == root / "out"  # the link itself, not its target


def test_perm_bits_drop_setuid():
    assert perm_bits(0o6777) == 0o777
    assert perm_bits(None) == 0o644
    assert perm_bits(0o100755) == 0o755


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "/", "c.txt", ".git", "\n", "\\"]), min_size=1, max_size=6))
def test_rel_path_never_escapes(parts):
    """Whatever joins, an accepted path stays below the root once normalised."""
    value = "/".join(parts)
    if is_rel_path(value) and ".git" not in value.split("/"):
        norm = os.path.normpath(os.path.join("/root", value))
        assert norm.startswith("/root/")


def test_read_input_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "big").write_bytes(b"x" * 2048)
    (tmp_path / "ok").write_bytes(b"data")
    assert read_input(tmp_path / "ok") == b"data"
    cases = {"fifo": "FIFO", "loop": "symbolic-link loop", ".": "directory", "missing": "does not exist"}
    for name, words in cases.items():
        with pytest.raises(UserError, match=words):
            read_input(tmp_path / name, what="spec")
    with pytest.raises(UserError, match="device"):
        read_input("/dev/null", what="spec")
    with pytest.raises(UserError, match="larger than"):
        read_input(tmp_path / "big", limit=1024)
