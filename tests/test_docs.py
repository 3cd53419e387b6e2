"""The docs (issues 22 and 29): the README is the front door (at most 1,000 words, its two commands
are the ones CI runs), README and docs together are at most 35,000 words, every kernel count a page
quotes is the one the tool computes (docs/kernel-counts.json, written by scripts/kernel_counts.py),
the release list is the adapter table's, and the site builds with `mkdocs build --strict` (when
mkdocs is installed: the `docs` extra; CI builds it after the tests)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.upstream import SUPPORTED_RELEASES

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
COUNTS = json.loads((REPO / "docs" / "kernel-counts.json").read_text(encoding="utf-8"))["kernels"]
MARKED = re.compile(r"([0-9][0-9,]*)<!-- kernels (\S+) (\S+) -->")
STALE = ("2,399", "3,353", "4,941", "3,055")  # counts of earlier specs the docs used to quote (issue 22)


def test_readme_is_at_most_1000_words():
    assert len(README.split()) <= 1000, len(README.split())


def test_readme_and_docs_are_at_most_35000_words():
    """Issue 29 item 6: README plus every page under docs/ (in the nav or not) stay within 35,000
    words, counted as `wc -w` counts them; a new page makes room by linking, not repeating."""
    words = {page.relative_to(REPO).as_posix(): len(page.read_text(encoding="utf-8").split()) for page in PAGES}
    assert "docs/measurements.md" in words and len(words) > 30, sorted(words)  # the glob found the site
    total = sum(words.values())
    assert total <= 35_000, (total, sorted(words.items(), key=lambda kv: -kv[1])[:5])


def test_readme_commands_are_the_ones_ci_runs():
    block = README.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("   #")[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 2, commands
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for cmd in commands:
        assert cmd in ci, f"README command not run verbatim by .ci/run: {cmd}"


def test_readme_release_list_is_the_adapter_table():
    m = re.search(r"<!-- releases -->(.*?)<!-- /releases -->", README)
    assert m, "README marks its release list with <!-- releases --> ... <!-- /releases -->"
    assert [r.strip() for r in m.group(1).split(",")] == list(SUPPORTED_RELEASES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_quoted_kernel_counts_are_computed(page):
    text = page.read_text(encoding="utf-8")
    for number, release, label in MARKED.findall(text):
        assert label in COUNTS.get(release, {}), f"{page.name}: no computed count for {release} {label}"
        assert int(number.replace(",", "")) == COUNTS[release][label], (page.name, release, label, number)
    if page.name == "measurements.md":
        return
    for line in text.splitlines():  # a count of an earlier spec only as history: "then" or a date on its line
        for stale in STALE:
            if stale in line:
                assert " then" in line or re.search(r"20\d\d-\d\d-\d\d", line), (page.name, line)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (pip install -e '.[docs]')")
def test_site_builds_strict(tmp_path):
    # not -q: it silences the warnings --strict counts (the build would pass with broken links)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "mi100-codegen report" in cli and "--triton-version" in cli  # generated from the Typer app
    spec = (tmp_path / "site" / "reference" / "spec" / "index.html").read_text(encoding="utf-8")
    assert "head_dims" in spec and "donor_gpu" in spec  # from the Pydantic schema


def test_readme_links_resolve():
    """The README is not part of the site (the strict build does not check it): its relative links
    must name files of the repository."""
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        assert (REPO / target.split("#")[0]).exists(), target
