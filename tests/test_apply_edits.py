"""Anchored edit ops on synthetic text (fast, no upstream tree)."""

from __future__ import annotations

import pytest

from dataclasses import replace

from codegen.apply.edits import EditConflict, EditSkipped, apply_edit
from codegen.upstream.edits import EditRecord

TABLES = (
    "AOTRITON_SUPPORTED_GPUS = (\n    'gfx90a_mod0',\n    'gfx942_mod0',\n)\n"
    "AOTRITON_ARCH_TO_PACK = {\n    'gfx90a'    : 'gfx90a',\n    'gfx1100'   : 'gfx11xx',\n}\n"
    "KNOWN_TARGETS_64 = ['gfx90a', 'gfx942', 'gfx950']\n"
)


def E(**kw):
    base = {"id": "t", "path": "x.py", "optional": False, "symbol": "", "neighbour": "", "payload": "", "why": ""}
    base.update(kw)
    return EditRecord(**base)


def test_seq_insert_before_clones_indentation():
    out = apply_edit(TABLES, E(op="python.seq_insert", symbol="AOTRITON_SUPPORTED_GPUS",
                               neighbour="'gfx90a_mod0'", payload="'gfx908_mod0'"))
    assert "(\n    'gfx908_mod0',\n    'gfx90a_mod0',\n" in out


def test_seq_insert_single_line_list_and_after_last():
    out = apply_edit(TABLES, E(op="python.seq_insert", symbol="KNOWN_TARGETS_64", neighbour="'gfx90a'",
                               payload="'gfx908'"))
    assert "KNOWN_TARGETS_64 = ['gfx908', 'gfx90a', 'gfx942', 'gfx950']\n" in out
    out = apply_edit(TABLES, E(op="python.seq_insert", symbol="KNOWN_TARGETS_64", neighbour="'gfx950'",
                               payload="'gfx908'", position="after"))
    assert "KNOWN_TARGETS_64 = ['gfx90a', 'gfx942', 'gfx950', 'gfx908']\n" in out


def test_dict_insert_keeps_colon_column():
    out = apply_edit(TABLES, E(op="python.dict_insert", symbol="AOTRITON_ARCH_TO_PACK", neighbour="'gfx90a'",
                               payload={"key": "'gfx908'", "value": "'gfx908'"}))
    assert "{\n    'gfx908'    : 'gfx908',\n    'gfx90a'    : 'gfx90a',\n" in out
    out = apply_edit(TABLES, E(op="python.dict_insert", symbol="AOTRITON_ARCH_TO_PACK", neighbour="'gfx90a'",
                               payload={"key": "'gfx1030'", "value": "'gfx1030'"}))
    assert "    'gfx1030'   : 'gfx1030',\n    'gfx90a'    : 'gfx90a',\n" in out


@pytest.mark.parametrize("neighbour,msg", [("'gfx90b_mod0'", "not found"), ("'gfx942_mod0'", None)])
def test_seq_insert_anchor_problems(neighbour, msg):
    text = TABLES.replace("'gfx942_mod0'", "'gfx90b_mod0'") if msg is None else TABLES
    if msg is None:  # the neighbour exists; the payload is already there -> conflict too
        text = text.replace("'gfx90b_mod0'", "'gfx908_mod0'")
        neighbour, msg = "'gfx90a_mod0'", "already contains"
    with pytest.raises(EditConflict, match=msg):
        apply_edit(text, E(op="python.seq_insert", symbol="AOTRITON_SUPPORTED_GPUS", neighbour=neighbour,
                           payload="'gfx908_mod0'"))


def test_optional_absent_symbol_skips_and_required_conflicts():
    e = E(op="python.dict_insert", symbol="AOTRITON_ARCH_PRODUCTION_LINE", neighbour="'gfx90a'",
          payload={"key": "'gfx908'", "value": "'CDNA'"})
    with pytest.raises(EditConflict, match="no module-level assignment"):
        apply_edit(TABLES, e)
    with pytest.raises(EditSkipped):
        apply_edit(TABLES, replace(e, optional=True))


def test_ambiguous_symbol_conflicts():
    with pytest.raises(EditConflict, match="2 times"):
        apply_edit(TABLES + "KNOWN_TARGETS_64 = []\n",
                   E(op="python.seq_insert", symbol="KNOWN_TARGETS_64", neighbour="'gfx90a'", payload="'gfx908'"))


def test_set_getenv_default_ignores_later_reassignment():
    text = ("import os\nX = os.getenv('X', default='16, 32, 64')\nX = [int(d) for d in X.split(',')]\n")
    out = apply_edit(text, E(op="python.set_getenv_default", symbol="X", neighbour="'X'", payload="'32, 64'"))
    assert "X = os.getenv('X', default='32, 64')\nX = [int" in out
    with pytest.raises(EditConflict):
        apply_edit(text, E(op="python.set_getenv_default", symbol="X", neighbour="'Y'", payload="'32'"))


FUNC = ("import os\n\n\ndef block_dmodel_values():\n    \"\"\"doc\"\"\"\n"
        "    env = os.getenv('X',\n                    default='16, 32, 64')\n"
        "    return [int(d) for d in env.split(',')]\n\n\nY = os.getenv('X', '8')\n")


def test_set_getenv_default_in_function_changes_only_that_call():
    e = E(op="python.set_getenv_default_in_function", symbol="block_dmodel_values", neighbour="'X'",
          payload="'32, 64'")
    out = apply_edit(FUNC, e)
    assert out == FUNC.replace("default='16, 32, 64'", "default='32, 64'")  # layout kept, Y untouched
    assert apply_edit(out, replace(e, payload="'16, 32, 64'")) == FUNC
    with pytest.raises(EditConflict, match="changes nothing"):
        apply_edit(out, e)
    with pytest.raises(EditConflict, match="no os.getenv\\('Y'\\) calls in block_dmodel_values"):
        apply_edit(FUNC, replace(e, neighbour="'Y'"))
    with pytest.raises(EditConflict, match="no module-level function other"):
        apply_edit(FUNC, replace(e, symbol="other"))
    with pytest.raises(EditSkipped):
        apply_edit(FUNC, replace(e, symbol="other", optional=True))
    twice = FUNC.replace("    return [int", "    env = os.getenv('X', default='1')\n    return [int")
    with pytest.raises(EditConflict, match="2 os.getenv"):
        apply_edit(twice, e)


CPP = ("enum AOTRITON_API Gpu : uint64_t {\n"
       "  GPU_AMD_ARCH_GFX90A_MOD0  = TRICAT(GpuVendor::kAMD,  0x90a, 0),\n"
       "};\n"
       "  { \"gfx90a\", DummyClassifier<GPU_AMD_ARCH_GFX90A_MOD0 >() },\n")


def test_clone_line_substitutes_and_inserts_before():
    out = apply_edit("".join(CPP.splitlines(True)[:3]), E(op="text.clone_line", path="util.h", symbol="enum Gpu",
                            neighbour="GPU_AMD_ARCH_GFX90A_MOD0 ",
                            payload={"substitute": [["GFX90A_MOD0", "GFX908_MOD0"], ["0x90a, 0)", "0x908, 0)"]]}))
    assert out.splitlines()[1] == "  GPU_AMD_ARCH_GFX908_MOD0  = TRICAT(GpuVendor::kAMD,  0x908, 0),"
    assert out.splitlines()[2] == "  GPU_AMD_ARCH_GFX90A_MOD0  = TRICAT(GpuVendor::kAMD,  0x90a, 0),"


def test_text_anchor_must_be_unique():
    with pytest.raises(EditConflict, match="matches 2 lines"):
        apply_edit(CPP, E(op="text.clone_line", path="util.h", symbol="enum Gpu", neighbour="GPU_AMD_ARCH_GFX90A_MOD0 ",
                          payload={"substitute": [["GFX90A", "GFX908"]]}))
    with pytest.raises(EditConflict, match="not found"):
        apply_edit("".join(CPP.splitlines(True)[:3]).replace("GFX90A_MOD0  =", "GFX90A_MODX  ="),
                   E(op="text.clone_line", path="util.h", symbol="enum Gpu",
                     neighbour="GPU_AMD_ARCH_GFX90A_MOD0 ", payload={"substitute": [["A", "B"]]}))


def test_substitute_and_replace_line_indentation():
    cm = 'set(AOTRITON_TARGET_ARCH "gfx90a;gfx942" CACHE STRING "x")\n'
    out = apply_edit(cm, E(op="text.substitute", path="CMakeLists.txt", symbol="AOTRITON_TARGET_ARCH",
                           neighbour='set(AOTRITON_TARGET_ARCH "', payload={"old": '"gfx90a;', "new": '"gfx90a;gfx908;'}))
    assert out == 'set(AOTRITON_TARGET_ARCH "gfx90a;gfx908;gfx942" CACHE STRING "x")\n'
    py = "    def g(self, f):\n        for cfg in self.gen(f):\n            yield cfg\n"
    out = apply_edit(py, E(op="text.replace_line", path="k.py", symbol="def g", neighbour="for cfg in self.gen(f):",
                           payload={"lines": ["import m  # hook", "for cfg in m.h(self, f):  # hook"]}))
    assert out == ("    def g(self, f):\n        import m  # hook\n        for cfg in m.h(self, f):  # hook\n"
                   "            yield cfg\n")


def test_local_comment_on_neighbour_line_conflicts():
    text = TABLES.replace("    'gfx90a'    : 'gfx90a',", "    'gfx90a'    : 'gfx90a',  # local")
    with pytest.raises(EditConflict, match="changed locally"):
        apply_edit(text, E(op="python.dict_insert", symbol="AOTRITON_ARCH_TO_PACK", neighbour="'gfx90a'",
                           payload={"key": "'gfx908'", "value": "'gfx908'"}))


def test_seq_insert_first_anchors_on_the_list_not_an_arch():
    """compile.known_targets: the arch goes first into its wave size's list, whatever that holds."""
    text = TABLES + "KNOWN_TARGETS_32 = ['gfx1100', 'gfx1101']\n"
    out = apply_edit(text, E(op="python.seq_insert_first", symbol="KNOWN_TARGETS_32", neighbour="[0]",
                             payload="'gfx1030'"))
    assert "KNOWN_TARGETS_32 = ['gfx1030', 'gfx1100', 'gfx1101']\n" in out
    multi = apply_edit(TABLES, E(op="python.seq_insert_first", symbol="AOTRITON_SUPPORTED_GPUS", neighbour="[0]",
                                 payload="'gfx906_mod0'"))
    assert "(\n    'gfx906_mod0',\n    'gfx90a_mod0',\n" in multi
    with pytest.raises(EditConflict, match="already contains"):
        apply_edit(out, E(op="python.seq_insert_first", symbol="KNOWN_TARGETS_32", neighbour="[0]",
                          payload="'gfx1030'"))
    with pytest.raises(EditConflict, match="non-empty"):
        apply_edit("KNOWN_TARGETS_32 = []\n", E(op="python.seq_insert_first", symbol="KNOWN_TARGETS_32",
                                                neighbour="[0]", payload="'gfx1030'"))


def test_list_insert_in_a_quoted_cmake_list():
    """cmake.target_arch: second element of the list, whichever arch comes first."""
    cmake = 'x\nset(AOTRITON_TARGET_ARCH "gfx90a;gfx942;gfx1100" CACHE STRING "Target GPU")\n'
    rec = E(op="text.list_insert", path="CMakeLists.txt", symbol="AOTRITON_TARGET_ARCH",
            neighbour='set(AOTRITON_TARGET_ARCH "', payload={"item": "gfx1030", "index": 1, "sep": ";"})
    out = apply_edit(cmake, rec)
    assert 'set(AOTRITON_TARGET_ARCH "gfx90a;gfx1030;gfx942;gfx1100" CACHE STRING "Target GPU")\n' in out
    with pytest.raises(EditConflict, match="already contains 'gfx1030'"):
        apply_edit(out, rec)
    first = apply_edit(cmake, replace(rec, payload={"item": "gfx906", "index": 0, "sep": ";"}))
    assert '"gfx906;gfx90a;gfx942;gfx1100"' in first
    with pytest.raises(EditConflict, match="not found"):
        apply_edit("set(OTHER \"a\")\n", replace(rec, symbol="OTHER"))


def test_strip_mentions_undoes_the_list_edits():
    from codegen.apply.mentions import strip_mentions

    recs = [E(op="text.list_insert", path="CMakeLists.txt", symbol="AOTRITON_TARGET_ARCH",
              neighbour='set(AOTRITON_TARGET_ARCH "', payload={"item": "gfx1030", "index": 1, "sep": ";"}),
            E(op="python.seq_insert_first", symbol="KNOWN_TARGETS_32", neighbour="[0]", payload="'gfx1030'")]
    text = 'set(AOTRITON_TARGET_ARCH "gfx90a;gfx1030;gfx942")\nKNOWN_TARGETS_32 = [\'gfx1030\', \'gfx1100\']\n'
    assert strip_mentions(text, "gfx1030", recs) == 'set(AOTRITON_TARGET_ARCH "gfx90a;gfx942")\nKNOWN_TARGETS_32 = [\'gfx1100\']\n'
