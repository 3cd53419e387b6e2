"""Fuzzing specs (hypothesis): mutations of rules/mi100.yaml — values of any type, renamed,
added and deleted keys, YAML syntax noise — through `render --spec X --out D`. Every case must
exit 0 or 2, print no traceback, locate every error as FILE:LINE:COL, and write nothing on error.

Default run: 3 properties x 30 cases; `-m slow`: 3 x 400 = 1,200 cases (tests/fuzz_profiles.py)."""

from __future__ import annotations

import io
import json
import re
import tempfile
from pathlib import Path

import pytest
from fuzz_profiles import fast, node_paths, slow
from hypothesis import given
from hypothesis import strategies as st
from ruamel.yaml import YAML
from typer.testing import CliRunner

from codegen.cli import app

REPO = Path(__file__).resolve().parents[1]
BASE_TEXT = (REPO / "rules" / "mi100.yaml").read_text()
BASE = YAML(typ="safe", pure=True).load(BASE_TEXT)


PATHS = [p for p in node_paths(BASE) if p]


def _at(doc, loc):
    for part in loc:
        doc = doc[part]
    return doc


CONTAINERS = [p for p in node_paths(BASE) if isinstance(_at(BASE, p), (dict, list))]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["gfx908", "fp16", "bf16", "fp32", "gfx90a_mod0", "0x10", "1e3", "yes", "~", ""]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def _dump(doc) -> str:
    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    buf = io.StringIO()
    y.dump(doc, buf)
    return buf.getvalue()


def _copy(doc):
    return YAML(typ="safe", pure=True).load(_dump(doc))


@st.composite
def value_mutations(draw):
    doc = _copy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        loc = draw(st.sampled_from(PATHS))
        try:
            parent = _at(doc, loc[:-1])
            parent[loc[-1]] = draw(values)
        except (KeyError, IndexError, TypeError):
            continue
    return _dump(doc)


@st.composite
def key_mutations(draw):
    doc = _copy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        loc = draw(st.sampled_from(CONTAINERS))
        try:
            node = _at(doc, loc)
        except (KeyError, IndexError, TypeError):
            continue
        op = draw(st.sampled_from(["delete", "rename", "add"]))
        if isinstance(node, dict) and node:
            key = draw(st.sampled_from(sorted(node, key=str)))
            if op == "delete":
                del node[key]
            elif op == "rename":
                node[draw(st.text(min_size=1, max_size=12))] = node.pop(key)
            else:
                node[draw(st.text(min_size=1, max_size=12))] = draw(values)
        elif isinstance(node, list) and node:
            i = draw(st.integers(0, len(node) - 1))
            if op == "delete":
                del node[i]
            else:
                node.insert(i, draw(values))
    return _dump(doc)


NOISE = st.sampled_from(list(":-[]{},#&*!|>'\"%@`?\t\n ") + ["\n  ", ": ", "- ", "&a ", "*a", "<<: ", "\x00", "\ufeff", "é"])


@st.composite
def syntax_noise(draw):
    text = BASE_TEXT
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "dup_line", "indent"]))
        if op == "insert":
            text = text[:pos] + "".join(draw(st.lists(NOISE, min_size=1, max_size=4))) + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 40)):]
        elif op == "dup_line":
            start = text.rfind("\n", 0, pos) + 1
            end = text.find("\n", pos)
            end = len(text) if end < 0 else end + 1
            text = text[:end] + text[start:end] + text[end:]
        else:
            start = text.rfind("\n", 0, pos) + 1
            text = text[:start] + " " * draw(st.integers(1, 3)) + text[start:]
    return text


def _check(text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        spec = Path(d) / "fuzz.yaml"
        spec.write_bytes(text.encode("utf-8", "surrogatepass"))
        out = Path(d) / "ov"
        r = CliRunner().invoke(app, ["render", "--spec", str(spec), "--out", str(out)])
        assert r.exit_code in (0, 2), (r.exit_code, r.output, text)
        assert "Traceback" not in r.output, r.output
        if r.exit_code == 2:
            assert not out.exists(), "written on error"
            located = re.compile(re.escape(str(spec)) + r":\d+:\d+: ")
            lines = [ln.strip() for ln in r.output.splitlines() if ln.strip()]
            errors = [ln.removeprefix("error: ") for ln in lines if ln not in ("error:",) and not ln.startswith("hint:")]
            assert errors, r.output
            assert all(located.match(ln) for ln in errors), r.output
        else:
            assert (out / "MANIFEST.json").is_file()


STRATEGIES = {"values": value_mutations(), "keys": key_mutations(), "syntax": syntax_noise()}


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_fuzz_spec(kind):
    @fast(30)
    @given(STRATEGIES[kind])
    def run(text):
        _check(text)

    run()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_fuzz_spec_slow(kind):
    @slow(400)
    @given(STRATEGIES[kind])
    def run(text):
        _check(text)

    run()


def _fast_agrees(text: str) -> None:
    """The libyaml fast path reads a text exactly as ruamel's round-trip loader does, or declines."""
    from codegen.core.errors import SpecError
    from codegen.formats.spec import _fast_doc, _parse_yaml, _plain

    fast = _fast_doc(text)
    if fast is None:
        return
    try:
        slow_doc = _plain(_parse_yaml(text, "fuzz.yaml"))
    except SpecError as exc:
        raise AssertionError(f"fast path read a text ruamel refuses ({exc}): {text!r}") from None
    assert json.dumps(fast) == json.dumps(slow_doc), text


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_fast_yaml_path_agrees_with_ruamel(kind):
    @fast(200)
    @given(STRATEGIES[kind])
    def run(text):
        _fast_agrees(text)

    run()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_fast_yaml_path_agrees_with_ruamel_slow(kind):
    @slow(2000)
    @given(STRATEGIES[kind])
    def run(text):
        _fast_agrees(text)

    run()


# Texts the slow fuzzer found where libyaml and ruamel read differently (issue 20): a U+FEFF that
# is not the first character (libyaml drops a byte-order mark anywhere, ruamel reads it as
# content and refuses the line), and other characters the two YAML versions break lines at.
DISAGREEING = {
    "bom_then_indented_blank_line": BASE_TEXT + "\ufeff\n  ",
    "bom_at_end": BASE_TEXT + "\ufeff",
    "indented_blank_line_then_bom": BASE_TEXT + "  \n\ufeff",
    "bom_mid_line": BASE_TEXT.replace("arch: gfx908", "arch: \ufeffgfx908", 1),
    "next_line_char": BASE_TEXT.replace("\ndescription", "\x85description", 1),
    "line_separator": BASE_TEXT + "\u2028",
    "carriage_return": BASE_TEXT.replace("\n", "\r", 3),
}


@pytest.mark.parametrize("case", sorted(DISAGREEING))
def test_fast_path_declines_what_the_readers_disagree_on(case):
    from codegen.formats.spec import _fast_doc

    text = DISAGREEING[case]
    assert _fast_doc(text) is None
    _fast_agrees(text)
    _check(text)


def test_fast_path_still_reads_a_leading_bom_and_non_ascii_comments():
    from codegen.formats.spec import _fast_doc

    assert _fast_doc("\ufeff" + BASE_TEXT) is not None  # a byte-order mark first: both skip it
    assert _fast_doc("# MI100 – é\n" + BASE_TEXT) is not None
