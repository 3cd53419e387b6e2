"""One home for a user's own work (`codegen.render.workspace`, docs/workspace.md): the spec, and the
measured results that belong to it, read and written the same way by tune import, render and
apply (fast; CPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.render import workspace
from codegen.cli import app
from codegen.core.errors import UserError
from codegen.render.inputs import load_inputs, render_overlay
from codegen.core.resources import data_dir, default_spec_path
from codegen.formats.spec import load_spec
from test_tune_import import line

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv(workspace.ENV_HOME, str(h))
    return h


@pytest.fixture
def tuning_log(tmp_path):
    p = tmp_path / "tune.json"
    recs = [line(bm=64, bn=32, wpe=2, time=(0.40, 0.3, 0.5)), line(bm=128, bn=64, time=(0.5, 0.4, 0.6))]
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return p


def test_homes(tmp_path, home):
    assert workspace.spec_home(default_spec_path()) == home
    assert workspace.spec_home(data_dir("rules") / "mi50.yaml") == home
    (tmp_path / "w" / "rules").mkdir(parents=True)
    assert workspace.spec_home(tmp_path / "w" / "rules" / "my.yaml") == (tmp_path / "w").resolve()
    assert workspace.spec_home(tmp_path / "w" / "my.yaml") == (tmp_path / "w").resolve()


def _measured(loaded) -> set[str]:
    return {w.config for w in load_inputs(loaded).measured}


def test_tune_import_writes_beside_your_spec_and_render_reads_it(tmp_path, home, tuning_log):
    mine = tmp_path / "work" / "my.yaml"
    mine.parent.mkdir()
    shutil.copy(default_spec_path(), mine)
    before = render_overlay(load_spec(mine)).manifest_sha256
    r = CliRunner().invoke(app, ["tune", "import", str(tuning_log), "--spec", str(mine), "--date", "2026-11-24"])
    assert r.exit_code == 0, r.output
    winners = tmp_path / "work" / "tuning" / "gfx908" / "winners.csv"
    assert winners.is_file() and str(winners.parent) in r.output.replace("\n", "")
    assert not (home / "tuning").exists()  # the shipped specs' home is untouched
    loaded = load_spec(mine)
    assert "attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0" in _measured(loaded)
    assert render_overlay(loaded).manifest_sha256 != before
    # the compile report still comes from the shipped data: per file, yours else shipped
    files = workspace.overlay_results(loaded)
    assert files["winners.csv"] == winners and files["compile_report.json"].parent == data_dir("tuning") / "gfx908"


def test_the_embedded_spec_uses_your_workspace(tmp_path, home, tuning_log, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = {p.name: p.read_bytes() for p in (data_dir("tuning") / "gfx908").glob("*.*")}
    r = CliRunner().invoke(app, ["tune", "import", str(tuning_log), "--date", "2026-11-24"])
    assert r.exit_code == 0, r.output
    assert (home / "tuning" / "gfx908" / "winners.csv").is_file()
    assert not (tmp_path / "tuning").exists()  # not the current folder, which render never read
    assert {p.name: p.read_bytes() for p in (data_dir("tuning") / "gfx908").glob("*.*")} == shipped
    assert "attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0" in _measured(load_spec(None))


def test_a_recorded_copy_of_your_spec_is_not_written_into(tmp_path, home):
    state = tmp_path / "tree" / ".mi100-codegen"
    state.mkdir(parents=True)
    (state / "spec.yaml").write_text(default_spec_path().read_text().replace("experimental: false",
                                                                             "experimental: true"))
    with pytest.raises(UserError, match="recorded state") as err:
        workspace.writable_results_dir(load_spec(state / "spec.yaml"))
    assert "--spec YOUR_SPEC" in err.value.hint
    shutil.copy(default_spec_path(), state / "spec.yaml")  # a shipped spec, recorded: your workspace
    assert workspace.writable_results_dir(load_spec(state / "spec.yaml")) == home / "tuning" / "gfx908"


def test_render_notes_an_edited_checkout_spec(tmp_path, home, monkeypatch):
    """An installed tool run in a checkout whose rules/mi100.yaml was edited says which one it renders."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "mi100.yaml").write_text(default_spec_path().read_text() + "# edited\n")
    r = CliRunner().invoke(app, ["render", "--out", str(tmp_path / "ov")])
    assert r.exit_code == 0, r.output
    assert "rules/mi100.yaml here differs from the spec embedded in this install" in r.output
    assert "--spec rules/mi100.yaml" in r.output


def test_every_command_without_a_tree_takes_the_same_rule(tmp_path, home, monkeypatch):
    """The one resolver (codegen.apply.applied_spec.resolve_spec): the note of an edited checkout
    comes with the embedded spec to every command that takes it, not only render; a given
    --spec gets no note."""
    from codegen.apply.applied_spec import resolve_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "mi100.yaml").write_text(default_spec_path().read_text() + "# edited\n")
    assert any("rules/mi100.yaml here differs" in w for w in resolve_spec(None, None).warnings)
    assert not any("differs" in w for w in resolve_spec(None, tmp_path / "rules" / "mi100.yaml").warnings)
    r = CliRunner().invoke(app, ["spec", "check"])
    assert r.exit_code == 0 and "rules/mi100.yaml here differs from the spec embedded" in r.output, r.output


# ------------------------------------------- the default spec, one command away (issue 39 item 2) --

def test_spec_show_prints_the_embedded_spec_with_its_comments(tmp_path, home, monkeypatch):
    """`spec show > my.yaml` is the copy the add-head-dim guide starts from: the shipped bytes,
    comments included, a spec that means the default; an unknown name lists the embedded ones."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["spec", "show"])
    assert r.exit_code == 0, r.output
    assert r.stdout == default_spec_path().read_text(encoding="utf-8") and r.stdout.count("\n# ") > 10
    mine = tmp_path / "my.yaml"
    mine.write_text(r.stdout)
    assert load_spec(mine).sha256 == load_spec(default_spec_path()).sha256
    r = CliRunner().invoke(app, ["spec", "show", "mi50"])
    assert r.exit_code == 0 and r.stdout == (data_dir("rules") / "mi50.yaml").read_text(encoding="utf-8")
    r = CliRunner().invoke(app, ["spec", "show", "../pyproject"])
    assert r.exit_code == 2 and "no embedded spec named '../pyproject'" in r.output
    assert "mi100, mi50, rdna2" in r.output and not r.stdout.strip().startswith("[")


def test_messages_name_embedded_specs_as_the_user_can_open_them(tmp_path, home, monkeypatch):
    """In a checkout (the CWD holds rules/), the embedded spec is `rules/mi100.yaml`; anywhere else
    it is named with the command that prints it, and an install's data inside site-packages below
    the CWD (a `.venv` there) is never named by that path."""
    from codegen.core import resources

    want = "rules/mi100.yaml (embedded: mi100-codegen spec show mi100)"
    monkeypatch.chdir(REPO)
    assert resources.display_path(default_spec_path()) == "rules/mi100.yaml"
    monkeypatch.chdir(tmp_path)
    assert resources.display_path(default_spec_path()) == want
    r = CliRunner().invoke(app, ["render", "--out", str(tmp_path / "ov")])
    assert r.exit_code == 0 and f"spec {want})" in r.output, r.output
    # a wheel's layout: the data inside the package, the package in a venv below the CWD
    pkg = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages" / "codegen"
    shutil.copytree(data_dir("rules"), pkg / "_data" / "rules")
    monkeypatch.setattr(resources, "_PKG", pkg)
    assert resources.display_path(pkg / "_data" / "rules" / "mi50.yaml") == \
        "rules/mi50.yaml (embedded: mi100-codegen spec show mi50)"
    assert resources.display_path(pkg / "__init__.py") == str(pkg / "__init__.py")  # not data: as given
