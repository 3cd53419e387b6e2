"""The functional key is declared once (codegen.models.functional, issue 37 item 1): every row and
case that carries it takes its fields from there, so a field added to the key is seen by all of
them (checked on a copy of the package with one more field)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

from codegen.formats.tuning_csv import KEY_COLUMNS, MEASUREMENT_COLUMNS, WINNER_COLUMNS
from codegen.gpu.tune.grid import GridEntry
from codegen.models.cases import Case, Shape
from codegen.models.functional import FIELDS, Functional
from codegen.models.rows import Winner
from codegen.ship.dispatch import DispatchCase

REPO = Path(__file__).resolve().parents[1]
KEY = Functional("fp16", 64, True, False, False, 97, 211)

# What each carrier's key is, given the carrier made from KEY (run here and in the copy).
CARRIERS = '''
import dataclasses
from codegen.formats.tuning_csv import KEY_COLUMNS
from codegen.gpu.tune.grid import GridEntry
from codegen.models.cases import Case, Shape
from codegen.models.functional import FIELDS, Functional
from codegen.models.rows import Winner
from codegen.ship.dispatch import DispatchCase

def carriers(key):
    row = {"gpu": "gfx908_mod0", "family": "attn_fwd", **dataclasses.asdict(key)}
    shape = Shape(2, 4, 4, key.seqlen_q, key.seqlen_k)
    return {
        "winner": Winner(**row).functional,
        "winner_fields": tuple(Winner.model_fields)[2:2 + len(FIELDS)],
        "grid": Functional.of(GridEntry("attn_fwd", "gfx908", *dataclasses.astuple(key))),
        "grid_fields": tuple(f.name for f in dataclasses.fields(GridEntry))[2:],
        "case": Functional.of(Case(*dataclasses.astuple(key), batch=2, heads_q=4, heads_k=4)),
        "dispatch": DispatchCase("c", key.dtype, key.head_dim, key.causal, shape, key.bias,
                                 0.25 if key.dropout else 0.0).functional,
        "csv_key": KEY_COLUMNS[2:],
    }
'''


def _carriers(key: Functional) -> dict:
    scope: dict = {}
    exec(CARRIERS, scope)
    return scope["carriers"](key)


def test_every_carrier_has_the_key():
    got = _carriers(KEY)
    for name in ("winner", "grid", "case", "dispatch"):
        assert got[name] == KEY, name
    for name in ("winner_fields", "grid_fields", "csv_key"):
        assert got[name] == FIELDS, name
    assert WINNER_COLUMNS[:len(KEY_COLUMNS)] == KEY_COLUMNS and MEASUREMENT_COLUMNS[1:len(KEY_COLUMNS) + 1] == KEY_COLUMNS
    assert Case.at("fp16", 64, True, Shape(2, 4, 4, 97, 211)) == Case(*dataclasses.astuple(KEY), batch=2, heads_q=4,
                                                                       heads_k=4)
    assert issubclass(GridEntry, Functional) and issubclass(Case, Functional)
    assert Winner(gpu="g", family="attn_fwd", **dataclasses.asdict(KEY)).to_json()["causal"] == 1


def test_a_field_added_to_the_key_is_seen_by_every_carrier(tmp_path):
    """A copy of the package whose key has one more field (`window`): every carrier has it, with
    the value it was given where it is a field of its own (winners, grid entries, cases)."""
    shutil.copytree(REPO / "codegen", tmp_path / "codegen", ignore=shutil.ignore_patterns("__pycache__"))
    module = tmp_path / "codegen" / "models" / "functional.py"
    text = module.read_text()
    assert "    seqlen_k: int\n" in text
    module.write_text(text.replace("    seqlen_k: int\n", "    seqlen_k: int\n    window: int = 0\n", 1))
    probe = CARRIERS + '''
import codegen
assert codegen.__file__.startswith(%r), codegen.__file__
key = Functional("fp16", 64, True, False, False, 97, 211, 7)
got = carriers(key)
assert FIELDS[-1] == "window"
for name in ("winner", "grid", "case"):
    assert got[name] == key, (name, got[name])
assert got["dispatch"].window == 0   # a dispatch case names no window: the key's default
for name in ("winner_fields", "grid_fields", "csv_key"):
    assert got[name] == FIELDS, (name, got[name])
print("seen")
''' % str(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "seen", r.stderr[-3000:]
