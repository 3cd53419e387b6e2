"""Every PyTorch line 2.8 .. 2.14: the AOTriton release its wheels link, the library file name, and
what `torch status`, `torch rebuild-recipe` pick for it (the newest supported release of the line
the installed torch links), on real ELF fixtures."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.ship.layout import (TORCH_LINES, TORCH_RELEASES, TORCH_TO_AOTRITON,
                                              build_release_for_line, parse_tag, tag_line)
from codegen.upstream import SUPPORTED
from codegen.upstream.releases import RELEASES, by_release, release_name

from test_torch_install import build_torch, need_cc

# torch line -> (AOTriton tag its wheels link, file libtorch_hip.so needs, release we build or None)
LINES = {
    "2.7": ("0.9.2b", "libaotriton_v2.so.0.9.2", None),  # a release line mi100-codegen does not support
    "2.8": ("0.10b", "libaotriton_v2.so.0.10.0", "0.10b"),
    "2.9": ("0.11b", "libaotriton_v2.so.0.11.0", "0.11.2b"),
    "2.10": ("0.11.1b", "libaotriton_v2.so.0.11.1", "0.11.2b"),
    "2.11": ("0.11.2b", "libaotriton_v2.so.0.11.2", "0.11.2b"),
    "2.12": ("0.11.2b", "libaotriton_v2.so.0.11.2", "0.11.2b"),
    "2.13": ("0.12b", "libaotriton_v2.so.0.12.0", "0.12.1b"),
    "2.14": ("0.13b", "libaotriton_v2.so.0.13.0", "0.13b"),  # PyTorch main; zip images
}


def _cli(*args):
    return CliRunner().invoke(app, list(args))


def test_table_covers_every_line():
    assert {k: v[0] for k, v in LINES.items()} == {k: v for k, v in TORCH_TO_AOTRITON.items() if k in LINES}
    assert [t.torch for t in TORCH_LINES] == sorted(TORCH_TO_AOTRITON, key=lambda s: tuple(map(int, s.split("."))))
    for line, (tag, lib, build) in LINES.items():
        assert by_release(tag).library == lib   # the file libtorch_hip.so needs
        assert build_release_for_line(tag_line(tag)) == build, line
    assert parse_tag("0.12.1b") == (0, 12, 1) and parse_tag("0.13b") == (0, 13, 0) and parse_tag("x") is None
    # every supported release is reachable from some torch line, and torch builds every one of
    # them; a snapshot of main (0.14.0-dev) is no release any PyTorch line links
    releases = tuple(r.release for r in SUPPORTED if not r.snapshot)
    assert {tag_line(t) for t in releases} <= {tag_line(v[0]) for v in LINES.values()}
    assert TORCH_RELEASES == releases
    assert all(not r.torch_lines for r in SUPPORTED if r.snapshot) and len(releases) < len(SUPPORTED)


def test_parse_tag_is_release_names_parser():
    """The one parser and printer of a tag live together (codegen.upstream.releases)."""
    for r in RELEASES:
        if r.snapshot:
            assert parse_tag(r.release) is None, r.release
        else:
            assert parse_tag(r.release) == r.version and release_name(parse_tag(r.release)) == r.release
    assert parse_tag("0.12b\n") is None and tag_line("0.12b\n") is None


@pytest.mark.parametrize("line", sorted(LINES))
def test_status_and_recipe_per_torch_line(tmp_path, line):
    need_cc()
    tag, lib, build = LINES[line]
    site = tmp_path / "site"
    aot_version = ".".join(map(str, parse_tag(tag)))
    build_torch(site, version=f"{line}.0+rocm7.0", aot_version=aot_version)
    torch_dir = str(site / "torch")

    r = _cli("torch", "status", "--torch-dir", torch_dir, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["aotriton_needed"] == lib
    assert s["release_tag"] == tag and s["expected_release_for_torch"] == tag
    assert s["build_release"] == build
    text = _cli("torch", "status", "--torch-dir", torch_dir).stdout

    r = _cli("torch", "rebuild-recipe", "--torch-dir", torch_dir)
    if build is None:
        assert f"not support the {tag_line(tag)} release line yet" in s["build_release_problem"]
        assert f"build with:       none: AOTriton {tag} (PyTorch {line})" in text
        assert r.exit_code == 2
        assert f"does not support the {tag_line(tag)} release line yet; releases it builds for PyTorch: " \
            + ", ".join(TORCH_RELEASES) in r.output
        return
    assert f"build with:       AOTriton {build}" in text
    assert r.exit_code == 0, r.output
    branch = next(t.branch for t in TORCH_LINES if t.torch == line)
    assert f"--branch {branch}" in r.stdout  # the installed torch's own line (2.11 and 2.12 share 0.11.2b)
    assert f"linked against the AOTriton {build}" in r.stdout


def test_rebuild_recipe_release_lines():
    r = _cli("torch", "rebuild-recipe", "--release", "0.12.1b")
    assert r.exit_code == 0, r.output
    assert "--branch release/2.13" in r.stdout
    r = _cli("torch", "rebuild-recipe", "--release", "0.12b")
    assert r.exit_code == 0 and "--branch release/2.13" in r.stdout
    r = _cli("torch", "rebuild-recipe", "--release", "0.13b")
    assert r.exit_code == 0, r.output
    assert "--branch main" in r.stdout
    r = _cli("torch", "rebuild-recipe", "--release", "0.9.2b")
    assert r.exit_code == 2
    assert "AOTriton 0.9.2b (PyTorch 2.7): mi100-codegen's torch integration does not support the 0.9 release line yet" in r.output
    r = _cli("torch", "rebuild-recipe", "--release", "0.14b")
    assert r.exit_code == 2 and "no known PyTorch release links AOTriton 0.14b" in r.output


def test_torch_213_linking_the_point_release(tmp_path):
    """Some 2.13 builds pin 0.12.1b (PyTorch's aotriton.cmake at commit 8fdb4a4): the file name
    torch needs is then libaotriton_v2.so.0.12.1; status still reads it from DT_NEEDED, and the
    line (0.12) decides what to build."""
    need_cc()
    site = tmp_path / "site"
    build_torch(site, version="2.13.0+rocm7.1", aot_version="0.12.1")
    r = _cli("torch", "status", "--torch-dir", str(site / "torch"), "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["aotriton_needed"] == "libaotriton_v2.so.0.12.1"
    assert (s["release_tag"], s["release_line"], s["expected_release_for_torch"], s["build_release"]) == \
        ("0.12.1b", "0.12", "0.12b", "0.12.1b")
