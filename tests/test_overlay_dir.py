"""`render --out` into a directory the user owns: only our files are touched (those we write and
those our previous MANIFEST lists), the directory and its mode are kept, a read-only or
unwritable target is refused, and OS errors (full disk) are one message with nothing half-written."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.render import overlay_dir
from codegen.cli import app


def _render(out: Path, *extra: str):
    return CliRunner().invoke(app, ["render", "--out", str(out), *extra])


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def overlay(tmp_path) -> Path:
    out = tmp_path / "ov"
    assert _render(out).exit_code == 0
    return out


def test_user_files_survive_a_rewrite_and_check_ignores_them(overlay):
    (overlay / "NOTES.txt").write_text("my notes")
    (overlay / "rows" / "README").write_text("mine too")
    space = overlay / "space.json"
    space.write_text(space.read_text().replace("attn_fwd", "attn_fwX", 1))
    assert _render(overlay, "--check").exit_code == 1
    r = _render(overlay)
    assert r.exit_code == 0 and "wrote" in r.output
    assert (overlay / "NOTES.txt").read_text() == "my notes"
    assert (overlay / "rows" / "README").read_text() == "mine too"
    assert _render(overlay, "--check").exit_code == 0  # the user's files are not drift
    assert not list(overlay.rglob(".*.tmp"))


def test_directory_and_its_mode_are_kept(overlay):
    os.chmod(overlay, 0o750)
    ino = overlay.stat().st_ino
    space = overlay / "space.json"
    space.write_text("{}\n")
    assert _render(overlay).exit_code == 0
    assert overlay.stat().st_ino == ino
    assert oct(overlay.stat().st_mode & 0o777) == oct(0o750)
    assert oct(space.stat().st_mode & 0o777) == oct(0o644)


def test_read_only_overlay_is_refused_untouched(overlay):
    (overlay / "space.json").write_text("{}\n")
    before = _tree(overlay)
    os.chmod(overlay, 0o555)
    try:
        r = _render(overlay)
        assert r.exit_code == 2, r.output
        assert "read-only (mode 0555)" in r.output and "Traceback" not in r.output
        assert _tree(overlay) == before
        assert oct(overlay.stat().st_mode & 0o777) == oct(0o555)
    finally:
        os.chmod(overlay, 0o755)


def test_parent_that_is_a_file_or_read_only(tmp_path):
    (tmp_path / "afile").write_text("x")
    r = _render(tmp_path / "afile" / "ov")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "render: cannot write the overlay" in r.output or "not a directory" in r.output.lower()
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    try:
        r = _render(ro / "sub" / "ov")
        assert r.exit_code == 2 and "read-only" in r.output, r.output
        assert list(ro.iterdir()) == []
    finally:
        os.chmod(ro, 0o755)


def _full_disk(monkeypatch, root: Path, after_bytes: int = 0):
    """os.write fails with ENOSPC for files under `root` once `after_bytes` were written there."""
    real = os.write
    written = [0]

    def write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(str(root)):
            if written[0] + len(data) > after_bytes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written[0] += len(data)
        return real(fd, data)

    monkeypatch.setattr(overlay_dir.os, "write", write)


def test_full_disk_leaves_the_old_overlay_and_no_temp_files(overlay, monkeypatch):
    (overlay / "space.json").write_text("{}\n")
    (overlay / "edits.json").write_text("{}\n")
    before = _tree(overlay)
    _full_disk(monkeypatch, overlay, after_bytes=8000)  # the first staged file fits, a later one not
    r = _render(overlay)
    assert r.exit_code == 3, r.output
    assert "No space left on device" in r.output and "nothing was changed" in r.output
    assert "Traceback" not in r.output
    assert _tree(overlay) == before


def test_full_disk_on_a_fresh_overlay_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "new" / "deeper" / "ov"
    _full_disk(monkeypatch, tmp_path)
    r = _render(out)
    assert r.exit_code == 3, r.output
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------ issue 20: only what we wrote, inside --

def test_a_manifest_we_did_not_write_is_not_ours(tmp_path):
    """A user's folder that happens to hold a MANIFEST.json listing files: refused, nothing deleted."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "data.csv").write_text("precious\n")
    (out / "MANIFEST.json").write_text('{"outputs": [{"path": "data.csv", "sha256": "x"}]}')
    before = _tree(out)
    r = _render(out)
    assert r.exit_code == 2 and "not written by mi100-codegen" in r.stderr, r.output
    assert _tree(out) == before


def test_stale_output_changed_by_the_user_is_kept(overlay):
    """A file our previous MANIFEST lists but that the user changed since is not ours to delete."""
    man = json.loads((overlay / "MANIFEST.json").read_text())
    (overlay / "old_output.txt").write_text("we wrote this\n")
    (overlay / "edited.txt").write_text("the user's now\n")
    man["outputs"] += [{"id": "x", "path": "old_output.txt", "template": "t",
                        "sha256": hashlib.sha256(b"we wrote this\n").hexdigest()},
                       {"id": "y", "path": "edited.txt", "template": "t", "sha256": "0" * 64},
                       {"id": "z", "path": "../outside.txt", "template": "t", "sha256": "0" * 64}]
    (overlay / "MANIFEST.json").write_text(json.dumps(man))
    (overlay.parent / "outside.txt").write_text("outside\n")
    # a manifest with a path out of the folder is not ours: refused, nothing touched
    assert _render(overlay).exit_code == 2 and (overlay.parent / "outside.txt").exists()
    man["outputs"] = man["outputs"][:-1]
    (overlay / "MANIFEST.json").write_text(json.dumps(man))
    r = _render(overlay)
    assert r.exit_code == 0, r.output
    assert not (overlay / "old_output.txt").exists()  # ours, unchanged: removed as stale
    assert (overlay / "edited.txt").read_text() == "the user's now\n"  # changed: kept


def test_a_linked_subfolder_is_never_written_through(overlay, tmp_path):
    outside = tmp_path / "elsewhere"
    (overlay / "tree").rename(outside)
    os.symlink(outside, overlay / "tree")
    before = _tree(outside)
    (overlay / "space.json").write_text("{}")  # make the render want to write
    for args in ((), ("--check",)):
        r = _render(overlay, *args)
        assert r.exit_code == 2 and "symbolic link" in r.stderr and "Traceback" not in r.output, r.output
    assert _tree(outside) == before
