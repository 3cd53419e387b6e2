"""The spec apply records with the tree's state (`codegen.apply.applied_spec`): the stages after
apply use it by default, a different --spec is refused naming both, revert removes it, and a
recorded copy that was tampered with is refused naming the recorded file (fast, synthetic trees)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import pytest
from typer.testing import CliRunner

from codegen.apply.applied_spec import SPEC_COPY, resolve_spec
from codegen.apply.engine import apply_overlay
from codegen.apply.lock import LOCK_NAME, read_lock
from codegen.apply.revert import revert_tree
from codegen.cli import app
from codegen.core.errors import UserError
from codegen.formats.spec import load_spec
from fake_tree import make_fake_tree, snapshot, spec_variant

MINE = {"experimental: false": "experimental: true"}  # a spec of its own meaning


@pytest.fixture()
def applied(tmp_path):
    """A fake tree applied from a user's own spec, kept outside the tree."""
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    pristine = snapshot(tree)
    (tmp_path / "mine").mkdir()
    user = spec_variant(tmp_path / "mine", **MINE)
    loaded = load_spec(user)
    apply_overlay(tree, loaded)
    return tree, user, loaded, pristine


def test_recorded_copy_survives_the_user_file(applied):
    tree, user, loaded, _ = applied
    assert (tree / SPEC_COPY).read_bytes() == user.read_bytes()
    assert SPEC_COPY in read_lock(tree).recorded
    user.write_text("not: a spec\n")  # the user edits, then deletes their file
    user.unlink()
    got = resolve_spec(tree, None)
    assert got.sha256 == loaded.sha256 and got.spec.registration.experimental
    assert SPEC_COPY in got.display and "applied to this tree" in got.display


def test_a_different_spec_is_refused_naming_both(applied, tmp_path):
    tree, user, loaded, _ = applied
    assert resolve_spec(tree, user).sha256 == loaded.sha256  # the same spec: accepted
    with pytest.raises(UserError) as err:
        resolve_spec(tree, load_spec(None).path)
    msg = str(err.value)
    assert "mi100.yaml" in msg and SPEC_COPY in msg and "is not the spec this tree was applied from" in msg
    assert "apply" in err.value.hint


def test_plan_cli_refuses_another_spec_in_one_message(applied):
    tree, _, _, _ = applied
    res = CliRunner().invoke(app, ["plan", str(tree), "--spec", str(load_spec(None).path)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.output.count("error:") == 1 and SPEC_COPY in res.output


def test_revert_removes_the_copy_byte_identical(applied):
    tree, _, loaded, pristine = applied
    apply_overlay(tree, loaded)  # a second apply: nothing changes
    revert_tree(tree)
    assert snapshot(tree) == pristine


def test_reapply_with_another_spec_replaces_the_copy(applied):
    tree, user, _, _ = applied
    apply_overlay(tree, load_spec(None))
    assert (tree / SPEC_COPY).read_bytes() == load_spec(None).path.read_bytes()
    assert not resolve_spec(tree, None).spec.registration.experimental


@pytest.mark.parametrize("damage", ["edited", "same-meaning-edit", "missing", "symlink", "too-large", "fifo",
                                    "not-a-spec"])
def test_a_damaged_copy_is_refused_naming_it(applied, tmp_path, damage):
    tree, user, _, _ = applied
    copy = tree / SPEC_COPY
    if damage == "edited":
        copy.write_text(copy.read_text().replace("experimental: true", "experimental: false"))
    elif damage == "same-meaning-edit":
        copy.write_text(copy.read_text() + "# a comment\n")
    elif damage == "missing":
        copy.unlink()
    elif damage == "symlink":
        copy.unlink()
        copy.symlink_to(user)
    elif damage == "too-large":
        copy.write_bytes(b"#" * (1 << 20))
    elif damage == "fifo":
        copy.unlink()
        os.mkfifo(copy)
    elif damage == "not-a-spec":
        lock = json.loads((tree / LOCK_NAME).read_text())
        copy.write_text("name: [unclosed\n")
        lock["recorded"][SPEC_COPY] = hashlib.sha256(copy.read_bytes()).hexdigest()
        (tree / LOCK_NAME).write_text(json.dumps(lock))
    res = CliRunner().invoke(app, ["plan", str(tree), "--python", sys.executable])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "spec.yaml" in res.output
    assert "re-apply" in res.output


def test_a_lock_without_a_copy_is_checked_against_its_sha(applied):
    """A tree applied by an older mi100-codegen: the default spec must be the one it names."""
    tree, user, loaded, _ = applied
    lock = json.loads((tree / LOCK_NAME).read_text())
    del lock["recorded"]
    (tree / LOCK_NAME).write_text(json.dumps(lock))
    shutil.rmtree(tree / ".mi100-codegen" / "tuning")
    (tree / SPEC_COPY).unlink()
    assert resolve_spec(tree, user).sha256 == loaded.sha256
    with pytest.raises(UserError, match="embedded default"):
        resolve_spec(tree, None)


def test_the_results_it_rendered_with_are_recorded(applied):
    """The shipped compile report (the user's spec has no results of its own) is recorded beside
    the recorded spec, and rendering the recorded spec gives the manifest apply wrote."""
    from codegen.render.inputs import render_overlay
    from codegen.core.resources import data_dir

    tree, user, loaded, _ = applied
    rec = tree / ".mi100-codegen" / "tuning" / "gfx908" / "compile_report.json"
    assert rec.read_bytes() == (data_dir("tuning") / "gfx908" / "compile_report.json").read_bytes()
    assert render_overlay(resolve_spec(tree, None)).manifest_sha256 == read_lock(tree).manifest_sha256


def test_a_lock_naming_a_foreign_recorded_file_is_refused_by_revert(applied):
    tree, _, _, _ = applied
    lock = json.loads((tree / LOCK_NAME).read_text())
    lock["recorded"]["v3src/util.cc"] = "0" * 64
    (tree / LOCK_NAME).write_text(json.dumps(lock))
    before = snapshot(tree)
    with pytest.raises(UserError, match="not a file apply records"):
        revert_tree(tree)
    assert snapshot(tree) == before
