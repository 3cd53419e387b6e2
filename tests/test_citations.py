"""Tests cite only tests that exist: every test module (`tests/test_x.py`, `test_x.py`, `test_x`,
a glob `test_x_*`) and test (`tests/test_x.py::test_y`, a bare `test_y`) named in the code, the
scripts, the docs, the README, CI and the tests themselves is a module under tests/ or a
`def test_` in one. A rename or a removal that leaves a citation behind fails here with its place."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

TESTS = REPO / "tests"
SCANNED = ("codegen", "docs", "scripts", "tests")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".sh", ".toml", ".c", ".cc", ".h", ".j2", ".in"}
EXTRA = (REPO / "README.md", REPO / ".ci" / "run", REPO / "mkdocs.yml")
# a citation: an optional tests/ folder, the name, then .py or a glob star, then ::test_name
CITE = re.compile(r"(?<![\w./-])(?P<dir>tests/)?(?P<name>test_\w*)(?P<end>\.py|\*)?(?:::(?P<test>test_\w+))?")
DEF = re.compile(r"^\s*(?:async\s+)?def (test_\w+)", re.M)


def _modules() -> set[str]:
    return {p.stem for p in TESTS.glob("test_*.py")}


def _tests() -> set[str]:
    return {n for p in TESTS.rglob("*.py") for n in DEF.findall(p.read_text(encoding="utf-8"))}


def _files() -> list[Path]:
    out = [p for d in SCANNED for p in sorted((REPO / d).rglob("*"))
           if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    # this module's own examples are data, not citations
    return [p for p in out if p != Path(__file__).resolve()] + [p for p in EXTRA if p.is_file()]


def stale_citations(text: str, modules: set[str], tests: set[str]) -> list[str]:
    """The citations in `text` that name no test module or test (as `line: citation`). A bare
    quoted file name (`"test_k.py"`: a file a test writes) is data, not a citation."""
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        for m in CITE.finditer(line):
            name, end = m["name"], m["end"]
            if not m["dir"] and m.start() and line[m.start() - 1] in "\"'":
                continue
            if end == "*":
                ok = any(mod.startswith(name) for mod in modules)
            elif end == ".py" or m["dir"]:
                ok = name in modules
            else:
                ok = name in modules or name in tests
            if not ok or (m["test"] and m["test"] not in tests):
                out.append(f"{no}: {m[0]}")
    return out


def test_every_cited_test_exists():
    modules, tests = _modules(), _tests()
    assert len(modules) > 50 and "test_every_cited_test_exists" in tests
    stale = [f"{p.relative_to(REPO)}:{s}" for p in _files()
             for s in stale_citations(p.read_text(encoding="utf-8", errors="replace"), modules, tests)]
    assert not stale, "citations of tests that do not exist:\n" + "\n".join(stale)


def test_the_scan_finds_stale_citations():
    modules, tests = {"test_a", "test_ab_c"}, {"test_one"}
    good = ("see tests/test_a.py and test_ab_c.py, `tests/test_ab_*.py`, tests/test_a.py::test_one, "
            "test_one, test_a; (src / \"test_k.py\").write_text(...)")
    assert stale_citations(good, modules, tests) == []
    bad = "tests/test_b.py\nx test_b.py, tests/test_a.py::test_two, test_zz_*, test_two, 'tests/test_c.py'"
    assert stale_citations(bad, modules, tests) == [
        "1: tests/test_b.py", "2: test_b.py", "2: tests/test_a.py::test_two", "2: test_zz_*", "2: test_two",
        "2: tests/test_c.py"]
