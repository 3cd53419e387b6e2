"""Malformed specs: each gives exit code 2, every error as file:line:col, no traceback, nothing
written. The expected text is pinned in tests/golden/specs/<case>.txt; regenerate with
`MI100_REGEN_GOLDEN=1 pytest tests/test_spec_errors.py` and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.cli import app

REPO = Path(__file__).resolve().parents[1]
CASES = sorted(p.stem for p in (REPO / "tests/golden/specs").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _at_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_every_kind_of_malformed_spec_is_covered():
    kinds = {"syntax_error", "wrong_type", "unknown_key", "duplicate_key", "empty", "out_of_range",
             "inconsistent_tuning", "non_utf8"}
    assert kinds <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_spec_check_error_text_is_pinned(case):
    spec = f"tests/golden/specs/{case}.yaml"
    result = CliRunner().invoke(app, ["spec", "check", spec])
    assert result.exit_code == 2, result.output
    text = result.output
    assert "Traceback" not in text
    # every error line names the file and a line:col
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip() != "error:"]
    assert lines and all(ln.removeprefix("error: ").startswith(f"{spec}:") for ln in lines), text
    golden = REPO / f"tests/golden/specs/{case}.txt"
    if os.environ.get("MI100_REGEN_GOLDEN"):
        golden.write_text(text)
    assert golden.read_text() == text, (
        f"error text changed; regenerate with MI100_REGEN_GOLDEN=1 pytest {__file__}"
    )


@pytest.mark.parametrize("case", ["syntax_error", "wrong_type", "inconsistent_tuning", "non_utf8"])
def test_render_with_bad_spec_writes_nothing(case, tmp_path):
    out = tmp_path / "overlay"
    result = CliRunner().invoke(app, ["render", "--spec", f"tests/golden/specs/{case}.yaml", "--out", str(out)])
    assert result.exit_code == 2
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_missing_spec_file_is_a_user_error(tmp_path):
    result = CliRunner().invoke(app, ["spec", "check", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "spec file not found" in result.output


def test_debug_shows_traceback():
    result = CliRunner().invoke(app, ["--debug", "spec", "check", "tests/golden/specs/empty.yaml"])
    assert result.exit_code == 2
    assert "Traceback" in result.output


def test_a_python_object_tag_is_refused_by_name_and_nothing_runs(tmp_path, monkeypatch):
    """Issue 30 item 12: `arch: !!python/object/apply:os.system [...]` is exit 2 (a user error, not
    drift), the message names the tag, and the command it carries never runs."""
    spec = (REPO / "rules" / "mi100.yaml").read_text().replace(
        "\narch: gfx908", '\narch: !!python/object/apply:os.system ["touch ran"]', 1)
    assert "os.system" in spec
    (tmp_path / "evil.yaml").write_text(spec)
    monkeypatch.chdir(tmp_path)
    for args in (["spec", "check", "evil.yaml"], ["render", "--spec", "evil.yaml", "--out", "overlay"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "tag !!python/object/apply:os.system is not allowed" in result.output, result.output
        assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.yaml"]
