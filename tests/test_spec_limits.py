"""Hostile specs are refused fast, before YAML is composed: size, nesting depth, alias expansion
(limits in codegen.formats.spec, documented in docs/spec.md). Exit 2, one located message, no traceback,
nothing written."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.formats.spec import MAX_DEPTH, MAX_NODES, MAX_SPEC_BYTES


def _refused(spec, tmp_path, expect: str) -> str:
    out = tmp_path / "overlay"
    t0 = time.perf_counter()
    result = CliRunner().invoke(app, ["render", "--spec", str(spec), "--out", str(out)])
    elapsed = time.perf_counter() - t0
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert expect in result.output, result.output
    assert not out.exists()
    assert elapsed < 20, f"took {elapsed:.1f}s"
    return result.output


def test_a_spec_over_the_size_limit_is_not_read(tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("arch: gfx908\n" + "x: 1\n" * (MAX_SPEC_BYTES // 5 + 10))
    text = _refused(spec, tmp_path, f"spec is larger than {MAX_SPEC_BYTES // 1024} KiB")
    assert f"{spec}: spec is larger" in text


@pytest.mark.parametrize("doc, where", [
    ("arch: " + "[" * 60_000 + "\n", "1:70:"),                           # flow, 60k levels
    ("".join(" " * i + "a:\n" for i in range(300)), f"{MAX_DEPTH + 1}:{MAX_DEPTH + 1}:"),  # block
    ("a:\n" + "- " * 200 + "x\n", "2:1:"),                                # block sequences on one line
    ("a: {b: [" + "{c: [" * 40 + "\n", "1:"),                            # mixed flow
])
def test_nesting_deeper_than_the_limit_is_one_located_error(tmp_path, doc, where):
    spec = tmp_path / "deep.yaml"
    spec.write_text(doc)
    text = _refused(spec, tmp_path, f"nesting deeper than {MAX_DEPTH} levels")
    assert f"{spec}:{where}" in text


def test_alias_expansion_is_bounded(tmp_path):
    doc = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for c in "bcdefghij":
        doc += f"{c}: &{c} [" + ",".join([f"*{prev}"] * 10) + "]\n"
        prev = c
    assert len(doc) < 512  # 10**10 strings once expanded
    spec = tmp_path / "laughs.yaml"
    spec.write_text(doc)
    text = _refused(spec, tmp_path, f"more than {MAX_NODES} nodes once aliases are expanded")
    assert f"{spec}:" in text


def test_aliases_that_deepen_past_the_limit(tmp_path):
    doc = "a: &a " + "[" * 40 + "1" + "]" * 40 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n"
    spec = tmp_path / "deep_alias.yaml"
    spec.write_text(doc)
    _refused(spec, tmp_path, "once aliases are expanded")


def test_quotes_comments_and_block_scalars_do_not_count_as_nesting(tmp_path):
    from codegen.formats.spec import _nesting_error

    assert _nesting_error("a: '" + "[" * 100 + "'\nb: \"{{{" * 30 + "\"\n") is None
    assert _nesting_error("a: 1  # " + "[" * 100 + "\n") is None
    assert _nesting_error("a: |\n" + "".join("  " + " " * i + "x\n" for i in range(100)) + "b: 1\n") is None
    assert _nesting_error("a: it's [1]\n") is None
