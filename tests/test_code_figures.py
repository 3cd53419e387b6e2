"""The architecture bars of issue 10, measured by scripts/code_figures.py on codegen/'s AST:
no function over 80 lines, at most 5 over 60, every import inside a function justified by a
comment that names the start-up it saves (a number with ms or s) or the import-time dependency
it breaks, models/, render/ and spec.py import no stage package, atomic renames only in
fsutil.py and apply/journal.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# TODO(integrator): these packages are reworked on another branch (apply/render/upstream); once it
# is merged, empty this tuple so the bars hold for the whole of codegen/.
NOT_YET: tuple[str, ...] = ()  # packages exempt from the bars: none


def _figures() -> dict:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "code_figures.py"), "--json"],
                         capture_output=True, text=True, check=True)
    figs = json.loads(out.stdout)
    return {k: [i for i in v if not i.startswith(NOT_YET)] for k, v in figs.items()}


FIGS = _figures()


def test_the_script_prints_every_figure():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "code_figures.py")], capture_output=True,
                         text=True, check=True).stdout
    for line in ("functions over 80 lines:", "functions over 60 lines:", "imports inside functions:",
                 "models/, render/, spec.py import a stage package:", "files with os.replace/os.rename"):
        assert line in out


def test_no_function_over_80_lines():
    assert FIGS["functions_over_80"] == []


def test_at_most_five_functions_over_60_lines():
    assert len(FIGS["functions_over_60"]) <= 5, FIGS["functions_over_60"]


def test_every_import_inside_a_function_is_justified():
    assert FIGS["imports_in_functions_without_comment"] == []


def test_every_import_inside_a_function_names_its_cost():
    """issue 29: an inner import hides a dependency; it stays only where it saves start-up time,
    measured (e.g. `# CLI start-up: rich (~20 ms) loads only when a stage prints`), or breaks an
    import-time dependency (an optional package, an order, a cycle), and says which."""
    assert FIGS["imports_in_functions_without_cost"] == []


def test_pure_layers_import_no_stage():
    assert FIGS["pure_layer_imports_stage"] == []


def test_atomic_renames_only_in_the_atomic_writers():
    files = sorted({i.split(":")[0] for i in FIGS["atomic_renames_outside_owners"]})
    # TODO(hc): overlay_dir.py and torch_integration/install.py still write their own; shrink this
    # list as they move to codegen.core.fsutil
    assert set(files) <= {"codegen/render/overlay_dir.py", "codegen/ship/install.py",
                          # stdlib only: copied into the build venv as a standalone hook module
                          "codegen/compile/client.py"}, files


def test_the_measure_sees_what_it_should(tmp_path):
    """The script itself: a long function, an unjustified import and a rename are found."""
    pkg = tmp_path / "codegen" / "models"
    pkg.mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (pkg / "m.py").write_text("import os\n\n\ndef long():\n    import json\n" + body
                              + "\n    os.replace('a', 'b')\n    from ..plan import kernel_list\n")
    (pkg / "n.py").write_text("def f():\n    import csv  # loads when used\n\n\ndef g():\n"
                              "    # start-up: pydantic (~90 ms) loads when\n    # a model is read\n"
                              "    import pydantic\n    import zlib  # import-time dependency: optional\n")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "code_figures.py"), "--json", "--root",
                          str(tmp_path)], capture_output=True, text=True, check=True)
    figs = json.loads(out.stdout)
    assert [i.split(" ")[1] for i in figs["functions_over_80"]] == ["long"]
    assert figs["imports_in_functions_without_comment"] == ["codegen/models/m.py:5 json",
                                                            "codegen/models/m.py:92 codegen.plan"]
    assert figs["imports_in_functions_without_cost"] == ["codegen/models/n.py:2 csv"]
    assert figs["pure_layer_imports_stage"] == ["codegen/models/m.py:92 codegen.plan"]
    assert figs["atomic_renames_outside_owners"] == ["codegen/models/m.py:91"]
