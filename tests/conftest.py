"""Shared fixtures. Real AOTriton trees come from, in this order:

1. AOTRITON_GIT: a git dir of ROCm/aotriton; each tag is extracted (`git archive`) once per session;
2. AOTRITON_SRC: one extracted tree (tests for other releases skip with the reason);
3. the shared release archive `shared/upstream/aotriton-releases.tar.xz` in the checkout's parent
   folder (`../shared/...`; for a git worktree further up, the nearest ancestor that has one) or
   AOTRITON_ARCHIVE: every release it holds is extracted in one `tar` call, once per session, on
   first use; snapshots of main (`TAGS` line `main(<name>) <commit> <date>`, e.g. 0.14.0-dev) come
   from `aotriton-main-<yyyymmdd>.tar.xz` beside it (top folder `aotriton-main/`), extracted the
   same way. With AOTRITON_GIT a snapshot is its record's commit.

Tests that need a tree skip with the reason only when none of the three is available. The list of
releases is not repeated here: `SUPPORTED_TAGS` is the record table
(`codegen.upstream.SUPPORTED_RELEASES`, snapshots of main included), `ARCHIVE_TAGS` the archive's
`TAGS` file (which also holds releases we do not support, if any, for the refusal tests)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from codegen.upstream import SUPPORTED_RELEASES, by_release, detect, trees, UnsupportedTree
from codegen.ship.sysroot import Sysroot, find_sysroot

REPO = Path(__file__).resolve().parents[1]

# The user's workspace (codegen.render.workspace): the results a developer measured for the shipped
# specs must not change what the tests render. One empty folder for the whole session.
if not os.environ.get("MI100_CODEGEN_HOME"):
    import tempfile

    os.environ["MI100_CODEGEN_HOME"] = tempfile.mkdtemp(prefix="mi100-codegen-home-")

# The children a test interrupts must hear SIGINT: a test run started in the background (`cmd &`,
# nohup) inherits SIGINT ignored, an ignored signal stays ignored across exec, and those tests
# then skipped or failed. Such a run has no terminal to send this process a Ctrl-C anyway.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
SUPPORTED_TAGS: tuple[str, ...] = SUPPORTED_RELEASES
NO_TREE = (
    "needs a real AOTriton tree: set AOTRITON_GIT to a git dir of ROCm/aotriton "
    "(or AOTRITON_SRC to an extracted release tree), or provide ../shared/upstream/aotriton-releases.tar.xz"
)


@pytest.fixture(scope="session")
def gpu():
    """Skips the test unless torch sees a GPU (ROCm or CUDA): the GPU-marked tests ask for it, and
    in CI they skip with the reason. torch is imported only when one of them runs."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch and a GPU visible to it")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU visible to torch")


# The HIP majors whose private sysroot must be in the user cache (comma-separated): CI fetches the
# HIP 6 one before pytest (.ci/run) and names it here, so the tests that need it cannot skip there.
REQUIRED_SYSROOTS = "MI100_TEST_SYSROOTS"


def cached_sysroot(major: int) -> Sysroot | None:
    """The HIP `major` sysroot `bundle build` made in the user cache (codegen.ship.sysroot), None
    when it was never made (tests that need it skip); a major that $MI100_TEST_SYSROOTS names must be
    there: missing, it fails the run at collection instead of skipping."""
    found = find_sysroot(major)
    if found is None and str(major) in os.environ.get(REQUIRED_SYSROOTS, "").replace(" ", "").split(","):
        pytest.fail(f"{REQUIRED_SYSROOTS} names HIP {major}, but no HIP {major} sysroot is in the cache "
                    f"(codegen.ship.sysroot.ensure_sysroot({major}) makes it)", pytrace=False)
    return found


def release_archive() -> Path | None:
    """The shared archive of release trees: AOTRITON_ARCHIVE, else shared/upstream/ in the nearest
    ancestor of the checkout (../shared/upstream/ for a plain checkout): the rule `bundle verify`
    uses (codegen.upstream.trees)."""
    return trees.release_archive([REPO])


_archive_entries = trees.archive_entries   # tag -> (archive file, top folder), from the TAGS file


def archive_tags(archive: Path | None = None) -> tuple[str, ...]:
    """The tags (and snapshot names) the archives hold, from the `TAGS` file."""
    archive = archive or release_archive()
    return tuple(_archive_entries(archive)) if archive is not None else ()


ARCHIVE_TAGS: tuple[str, ...] = archive_tags()


def _tree_version(tree: Path) -> str | None:
    """The release a tree is (the adapters' own detection), None when it is none of them."""
    try:
        return detect(tree).release
    except UnsupportedTree:
        return None


@pytest.fixture(scope="session")
def _pristine_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("aotriton-pristine")


def _extract_archive(archive: Path, cache: Path) -> Path:
    """Everything an archive holds, extracted once (one tar call) into cache/<archive name>/."""
    dest = cache / archive.name.split(".tar")[0]
    if not dest.exists():
        tmp = cache / f".{dest.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        subprocess.run(["tar", "-xJf", str(archive), "-C", str(tmp)], check=True)
        tmp.rename(dest)
    return dest


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
                ref = by_release(tag).commit if by_release(tag).snapshot else tag
                archive = subprocess.run(
                    ["git", "-C", git_dir, "archive", ref], check=True, capture_output=True
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
        archive = release_archive()
        if archive is not None:
            entries = _archive_entries(archive)
            if tag not in entries:
                pytest.skip(f"{archive} has no release {tag} (its TAGS: {', '.join(entries)})")
            holder, top = entries[tag]
            if not holder.is_file():
                pytest.fail(f"{archive.parent}/TAGS lists {tag} but there is no {holder.name}")
            tree = _extract_archive(holder, _pristine_cache) / top
            if not tree.is_dir():
                pytest.fail(f"{holder}: TAGS lists {tag} but the archive has no {top}/")
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


@pytest.fixture(scope="session")
def aotriton_git_url(pristine_tree, _pristine_cache):
    """aotriton_git_url(tag) -> a URL `git clone --branch TAG` accepts: AOTRITON_GIT itself, else a
    one-commit repository made from the pristine tree (archive or AOTRITON_SRC), tagged TAG."""

    def get(tag: str) -> str:
        git_dir = os.environ.get("AOTRITON_GIT")
        if git_dir:
            return f"file://{git_dir}"
        repo = _pristine_cache / f"git-{tag}"
        if not repo.exists():
            tmp = _pristine_cache / f".git-{tag}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(pristine_tree(tag), tmp, symlinks=True)
            env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                       GIT_COMMITTER_EMAIL="t@t")
            for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", tag],
                         ["git", "tag", tag]):
                subprocess.run(argv, cwd=tmp, env=env, check=True, capture_output=True)
            tmp.rename(repo)
        return f"file://{repo}"

    return get
