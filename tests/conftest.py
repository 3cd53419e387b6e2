"""Shared fixtures. Real AOTriton trees come from AOTRITON_GIT (a git dir of ROCm/aotriton; each
tag is extracted once per session) or AOTRITON_SRC (one extracted tree); tests that need them
skip with the reason when neither is set."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUPPORTED_TAGS = ("0.10b", "0.11b", "0.11.1b", "0.11.2b", "0.12b")
NO_TREE = (
    "needs a real AOTriton tree: set AOTRITON_GIT to a git dir of ROCm/aotriton "
    "(or AOTRITON_SRC to an extracted release tree)"
)


def _tree_version(tree: Path) -> str | None:
    cm = tree / "CMakeLists.txt"
    if not cm.is_file():
        return None
    text = cm.read_text(errors="replace")
    parts = [re.search(rf"set\(AOTRITON_VERSION_{k}_INT\s+(\d+)\)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        return None
    major, minor, patch = (p.group(1) for p in parts)
    return f"{major}.{minor}b" if patch == "0" else f"{major}.{minor}.{patch}b"


@pytest.fixture(scope="session")
def _pristine_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("aotriton-pristine")


@pytest.fixture(scope="session")
def pristine_tree(_pristine_cache):
    """pristine_tree(tag) -> read-only path of a pristine extract of that release (cached)."""

    def get(tag: str) -> Path:
        git_dir = os.environ.get("AOTRITON_GIT")
        src = os.environ.get("AOTRITON_SRC")
        if git_dir:
            dest = _pristine_cache / tag
            if not dest.exists():
                tmp = _pristine_cache / f".{tag}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                archive = subprocess.run(
                    ["git", "-C", git_dir, "archive", tag], check=True, capture_output=True
                ).stdout
                subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
                tmp.rename(dest)
            return dest
        if src:
            tree = Path(src)
            have = _tree_version(tree)
            if have != tag:
                pytest.skip(f"AOTRITON_SRC is release {have}, this test needs {tag} (set AOTRITON_GIT for all)")
            return tree
        pytest.skip(NO_TREE)

    return get


@pytest.fixture
def fresh_tree(pristine_tree, tmp_path):
    """fresh_tree(tag) -> a writable copy of a pristine extract, private to the test."""

    def get(tag: str) -> Path:
        src = pristine_tree(tag)
        dest = tmp_path / f"aotriton-{tag}"
        shutil.copytree(src, dest, symlinks=True)
        return dest

    return get
