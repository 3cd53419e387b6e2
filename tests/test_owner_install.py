"""`torch install --bundle auto` on fake owner machines (tests/owner_machine.py: a KFD topology per
card family, wheel-shaped ROCm torch folders) against a loopback HTTP server (tests/loopback.py)
serving an index (`bundle index`) of fixture bundles (real ELF libraries linked against the wheel's
HIP runtime, test_bundle_index.make_bundle): the plan, the download verified and installed, a
download cut midway and resumed, index entries whose size or sha256 lie, an index that is not ours,
a torch built without AOTriton, several archs, the RDNA2 override, the local-build route planned
when the index has nothing or cannot be reached, an offline clone (after an index that failed:
both said), a redirect our URL rule refuses, a download that trickles, an index read that stalls,
and validate failing after the install. Every refusal: one message, torch byte for byte as it was.

A fixture bundle's library cannot pass `bundle check`'s emulated dispatch (its kernels are random
bytes), so the check is replaced here by a recorder; test_bundle_real.py runs the real one on a real
bundle, and tests/test_owner_build.py (slow) runs this command with the real check."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

import codegen.ship.owner as owner
from codegen.ship.fetch import LIMITS_ENV
from codegen.core.resources import default_spec_path
from codegen.formats.spec import load_spec
from codegen.ship.index import write_index
from loopback import Site, serve
from owner_machine import sysfs, wheel
from test_bundle_index import make_bundle
from test_torch_install import cli, load_which, need_cc, snapshot

NAME = "aotriton-0.11b-gfx908-hip6.mi100-bundle.zip"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """A folder of fixture bundles (gfx908 HIP 6 and 7, gfx1030 HIP 6) and its index.json."""
    need_cc()
    base = tmp_path_factory.mktemp("dist")
    for arch, hip in (("gfx908", 6), ("gfx908", 7), ("gfx1030", 6)):
        make_bundle(base / "dist", base / "work", arch, hip)
    write_index(base / "dist")
    return base / "dist"


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """An MI100 owner's machine: torch 2.9 on ROCm 6.4, the user cache in tmp_path, bundle check
    recorded, offline: a build here fails at once, so a test that did not plan one never runs one."""
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    offline(tmp_path / "cache", monkeypatch)
    monkeypatch.delenv("MI100_CODEGEN_INDEX", raising=False)
    checked: list[Path] = []

    def check(bundle, progress=None):
        checked.append(bundle.path)
        return SimpleNamespace(ok=True, claims=[], controls=[])

    monkeypatch.setattr(owner, "check_opened", check)
    return SimpleNamespace(site=tmp_path / "site", torch=wheel(tmp_path / "site", "2.9-rocm6.4"),
                           sys=sysfs(tmp_path / "sys", "gfx908"), cache=tmp_path / "cache", checked=checked)


def site_of(dist: Path, **faults) -> Site:
    return Site({f"/r/{p.name}": p.read_bytes() for p in dist.iterdir()}, **faults)


def auto(m, index: str, *more: str):
    return cli("torch", "install", "--bundle", "auto", "--index", index, "--torch-dir", str(m.torch),
               "--sysfs", str(m.sys), *more)


def test_dry_run_prints_the_plan_and_touches_nothing(machine, dist):
    before = snapshot(machine.site)
    with serve(site_of(dist)) as site:
        r = auto(machine, site.url("/r/"), "--dry-run")
        assert site.requests == [("/r/index.json", None)]
    assert r.exit_code == 0, r.output
    for words in ("card:     gfx908 (1 device(s), KFD topology", "torch:    2.9.1+rocm6.4",
                  "release:  AOTriton 0.11b (the release torch links)",
                  "links AOTriton 0.11b (libaotriton_v2.so.0.11.0)", "HIP:      6 (libamdhip64.so.6",
                  "spec:     mi100 (rules/mi100.yaml", f"bundle:   {NAME} from the index",
                  "dry run: nothing fetched, built or installed"):
        assert words in r.output, r.output
    assert snapshot(machine.site) == before and not (machine.cache / "owner").exists()


def test_installs_the_index_bundle_and_restores(machine, dist):
    before = snapshot(machine.site)
    with serve(site_of(dist)) as site:
        r = auto(machine, site.url("/r/index.json"))
    assert r.exit_code == 0, r.output
    assert f"installed: {NAME} as lib/libaotriton_v2.so.0.11.0 + images for gfx908" in r.output
    assert "validate not run (this Python imports" in r.output and "mi100-codegen report" in r.output
    assert load_which(machine.torch) == "mi100"
    assert machine.checked == [machine.cache / "owner" / "downloads" / NAME]
    s = json.loads(cli("torch", "status", "--torch-dir", str(machine.torch), "--json").stdout)
    assert s["ours"]["bundle"]["file"] == NAME
    assert cli("torch", "restore", "--torch-dir", str(machine.torch)).exit_code == 0
    assert snapshot(machine.site) == before


def test_a_folder_index_serves_as_well(machine, dist):
    r = auto(machine, str(dist))
    assert r.exit_code == 0, r.output
    assert load_which(machine.torch) == "mi100"


def test_a_download_cut_midway_resumes(machine, dist):
    before = snapshot(machine.site)
    with serve(site_of(dist, cut_after=1000, cut_path=f"/r/{NAME}")) as site:
        r = auto(machine, site.url("/r/"))
        assert r.exit_code == 3, r.output
        assert "closed the connection after 1,000 of" in r.output and "run the same command again" in r.output
        assert snapshot(machine.site) == before and machine.checked == []
        r = auto(machine, site.url("/r/"))
        assert r.exit_code == 0, r.output
        assert (f"/r/{NAME}", "bytes=1000-") in site.requests
    assert load_which(machine.torch) == "mi100"


def test_an_index_cut_midway_is_no_index_read(machine, dist):
    with serve(site_of(dist, cut_after=100, cut_path="/r/index.json")) as site:
        r = auto(machine, site.url("/r/"), "--dry-run")
    assert r.exit_code == 0 and "the index cannot be read (reading the bundle index: 127.0.0.1" in r.output, r.output
    assert "closed the connection after 100 of" in r.output


@pytest.mark.parametrize("field,value,words", [
    ("size", -1, "the index gives"),
    ("sha256", "f" * 64, "not the file the index names"),
])
def test_an_index_entry_that_lies_is_refused(machine, dist, tmp_path, field, value, words):
    index = json.loads((dist / "index.json").read_text())
    entry = next(e for e in index["bundles"] if e["file"] == NAME)
    entry[field] = entry["size"] + value if field == "size" else value
    site = site_of(dist)
    site.files["/r/index.json"] = json.dumps(index).encode()
    before = snapshot(machine.site)
    with serve(site) as s:
        r = auto(machine, s.url("/r/"))
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    assert snapshot(machine.site) == before and machine.checked == []
    assert list((machine.cache / "owner" / "downloads").iterdir()) == []


def test_an_entry_that_says_another_bundle_than_the_file_is_refused(machine, dist):
    """The gfx1030 bundle served as the gfx908 entry, its size and sha256 right: downloaded and
    verified, then the entry's claims checked against the bundle's own manifest."""
    other = (dist / "aotriton-0.11b-gfx1030-hip6.mi100-bundle.zip").read_bytes()
    index = json.loads((dist / "index.json").read_text())
    entry = next(e for e in index["bundles"] if e["file"] == NAME)
    entry["size"], entry["sha256"] = len(other), hashlib.sha256(other).hexdigest()
    site = site_of(dist)
    site.files["/r/index.json"], site.files[f"/r/{NAME}"] = json.dumps(index).encode(), other
    before = snapshot(machine.site)
    with serve(site) as s:
        r = auto(machine, s.url("/r/"))
    assert r.exit_code == 2, r.output
    assert "the index's entry does not describe the bundle it names: arch: the index says gfx908, the bundle gfx1030" \
        in r.output
    assert snapshot(machine.site) == before and machine.checked == []
    assert list((machine.cache / "owner" / "downloads").iterdir()) == []


@pytest.mark.parametrize("doc,words", [
    (b'{"name": "not ours", "releases": []}', "format: required field is missing (and 3 more problems)"),
    (b'{"format": 7, "bundles": []}', "bundle index format 7"),
    (b"[1, 2, 3]", "not a bundle index: expected a JSON object"),
    (b"\xff\xfe", "not UTF-8"),
    (b'{"format": 1, "bundles": [{"file": "../../x.mi100-bundle.zip"}]}', "bundles.0.file"),
    (b" " * (5 << 20), "larger than"),
    (b'{"format": 1, "bundles": [], "bundles": []}', "holds the key 'bundles' twice in one object"),
])
def test_an_index_that_is_not_ours_is_one_message(machine, doc, words):
    before = snapshot(machine.site)
    with serve(Site({"/r/index.json": doc})) as s:
        r = auto(machine, s.url("/r/"))
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output, r.output
    assert snapshot(machine.site) == before


def test_a_torch_without_aotriton_is_refused_before_anything(tmp_path, dist, monkeypatch):
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    root = wheel(tmp_path / "site", "flash-off")
    before = snapshot(tmp_path / "site")
    with serve(site_of(dist)) as s:
        r = cli("torch", "install", "--bundle", "auto", "--index", s.url("/r/"), "--torch-dir", str(root),
                "--sysfs", str(sysfs(tmp_path / "sys", "gfx1030")))
        assert s.requests == []
    assert r.exit_code == 2, r.output
    for words in ("does not link AOTriton at all", "pip install 'torch==2.9.*' --index-url "
                  "https://download.pytorch.org/whl/rocm6.4", "torch rebuild-recipe --release 0.11b --arch gfx1030"):
        assert words in r.output, r.output
    assert snapshot(tmp_path / "site") == before


def test_several_archs_need_arch(machine, dist):
    two = sysfs(machine.sys.parent / "two", "gfx908", "gfx1030")
    r = cli("torch", "install", "--bundle", "auto", "--index", str(dist), "--torch-dir", str(machine.torch),
            "--sysfs", str(two))
    assert r.exit_code == 2 and "GPUs of several archs: gfx1030 (1 device), gfx908 (1 device)" in r.output, r.output
    r = cli("torch", "install", "--bundle", "auto", "--index", str(dist), "--torch-dir", str(machine.torch),
            "--sysfs", str(two), "--arch", "gfx1030", "--dry-run")
    assert r.exit_code == 0 and "aotriton-0.11b-gfx1030-hip6.mi100-bundle.zip from the index" in r.output, r.output
    assert "this machine also has gfx908: the bundle's library dispatches for gfx1030 only" in r.output


def test_an_rdna2_variant_takes_the_gfx1030_bundle_and_says_the_override(machine, dist, monkeypatch):
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    r = cli("torch", "install", "--bundle", "auto", "--index", str(dist), "--torch-dir", str(machine.torch),
            "--sysfs", str(sysfs(machine.sys.parent / "navi22", "gfx1031")), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "runs gfx1030's kernels with HSA_OVERRIDE_GFX_VERSION=10.3.0: NOT set here" in r.output
    assert "aotriton-0.11b-gfx1030-hip6.mi100-bundle.zip from the index" in r.output


def test_no_bundle_in_the_index_or_no_index_plans_a_build_here(tmp_path, dist, monkeypatch):
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    root = wheel(tmp_path / "site", "2.14-rocm7")
    args = ["torch", "install", "--bundle", "auto", "--torch-dir", str(root), "--sysfs",
            str(sysfs(tmp_path / "sys", "gfx908")), "--dry-run"]
    r = cli(*args, "--index", str(dist))
    assert r.exit_code == 0, r.output
    assert ("aotriton-0.13b-gfx908-hip7.mi100-bundle.zip, built here: the index has no bundle of the AOTriton 0.13 "
            "line for gfx908, HIP 7") in r.output
    assert "release:  AOTriton 0.13b (the release torch links)" in r.output
    assert "time: about" in r.output and "3,043 kernels, 4,269 CPU-s measured for 0.13b mi100" in r.output
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = cli(*args, "--index", f"http://127.0.0.1:{port}/")
    assert r.exit_code == 0 and "built here: the index cannot be read (reading the bundle index: cannot reach" in r.output
    r = cli(*args, "--index", str(dist), "--build-locally")
    assert r.exit_code == 0 and "built here: --build-locally" in r.output, r.output


def test_offline_the_local_build_names_the_step_that_needs_the_network(machine, monkeypatch):
    before = snapshot(machine.site)
    r = auto(machine, str(machine.cache / "none"), "--build-locally")
    assert r.exit_code == 3, r.output
    assert "fetching AOTriton 0.11.2b (git clone https://127.0.0.1:9/aotriton.git)" in r.output
    assert "this step needs the network" in r.output and "AOTRITON_SRC" in r.output
    assert snapshot(machine.site) == before


def offline(cache: Path, monkeypatch) -> None:
    """No AOTriton tree can be had here: a build here fails at once (exit 3, git clone)."""
    monkeypatch.setenv("AOTRITON_ARCHIVE", str(cache / "no-archive"))
    monkeypatch.delenv("AOTRITON_SRC", raising=False)
    monkeypatch.delenv("AOTRITON_GIT", raising=False)
    monkeypatch.setattr(owner, "AOTRITON_URL", "https://127.0.0.1:9/aotriton.git")   # nothing listens there


def test_a_failed_fallback_build_says_the_index_failed_and_why(machine, monkeypatch):
    """The index answers 500: the plan builds here; offline, that build's final error is about git
    clone, and says too why it was built here at all."""
    with serve(Site({}, errors={"/r/index.json": 500})) as site:
        r = auto(machine, site.url("/r/"))
    assert r.exit_code == 3, r.output
    last = r.output[r.output.index("fetching AOTriton 0.11.2b (git clone"):]
    assert "(the bundle was built here because the index cannot be read: reading the bundle index: 127.0.0.1:" in last
    assert "answers HTTP 500" in last, r.output


@pytest.mark.parametrize("which", ["index", "bundle"])
def test_a_redirect_our_url_rule_refuses_is_hostile_never_a_fallback(machine, dist, which, monkeypatch):
    """file:// (which urllib itself refuses, as an HTTP error) and plain http to another host: exit 2
    naming the rule, for the index and the bundle alike; never the plan's build here."""
    for target in ("file:///etc/passwd", "http://10.0.0.1/x.json"):
        path = "/r/index.json" if which == "index" else f"/r/{NAME}"
        before = snapshot(machine.site)
        with serve(site_of(dist, redirects={path: target})) as site:
            r = auto(machine, site.url("/r/"))
        assert r.exit_code == 2, r.output
        assert f"a redirect to {target}: only https:// URLs are fetched" in r.output, r.output
        assert "built here" not in r.output and "Traceback" not in r.output
        assert snapshot(machine.site) == before and machine.checked == []


def test_a_trickling_download_ends_with_exit_3_and_resumes(machine, dist, monkeypatch):
    monkeypatch.setenv(LIMITS_ENV["speed_time"], "0.5")
    monkeypatch.setenv(LIMITS_ENV["speed_limit"], "1000")
    before = snapshot(machine.site)
    with serve(site_of(dist, trickle=0.01, slow_path=f"/r/{NAME}")) as site:
        r = auto(machine, site.url("/r/"))
        assert r.exit_code == 3, r.output
        assert "less than the minimum rate of 1,000 bytes a second" in r.output and "bytes are kept in" in r.output
        assert snapshot(machine.site) == before and machine.checked == []
        kept = next((machine.cache / "owner" / "downloads").glob("*.partial")).stat().st_size
        site.trickle = None
        r = auto(machine, site.url("/r/"))
        assert r.exit_code == 0, r.output
        assert site.requests[-1] == (f"/r/{NAME}", f"bytes={kept}-")
    assert load_which(machine.torch) == "mi100"


def test_an_index_read_that_stalls_ends_in_bounded_time(machine, dist, monkeypatch):
    monkeypatch.setenv(LIMITS_ENV["speed_time"], "0.5")
    with serve(site_of(dist, stall_after=10, slow_path="/r/index.json")) as site:
        r = auto(machine, site.url("/r/"), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "built here: the index cannot be read (reading the bundle index: 127.0.0.1:" in r.output
    assert "sent nothing for 0.5 s ($MI100_CODEGEN_SPEED_TIME)" in r.output


@pytest.mark.parametrize("plant,words", [
    ("owner-link", "is a symbolic link"),
    ("built-writable", "is writable by others"),
    ("bundle-writable", "is writable by others"),
    ("tree-link", "is a symbolic link"),
])
def test_a_cache_folder_others_could_have_written_is_refused(machine, tmp_path, plant, words):
    """What the local build finds in its cache is believed (a bundle built here is installed without
    bundle check, a tree's generator runs): a link, or what others may write, is refused first."""
    owner_dir, other = machine.cache / "owner", tmp_path / "elsewhere"
    other.mkdir()
    if plant == "owner-link":
        machine.cache.mkdir()
        owner_dir.symlink_to(other)
    elif plant == "built-writable":
        (owner_dir / "built").mkdir(parents=True)
        (owner_dir / "built").chmod(0o777)
    elif plant == "bundle-writable":
        planted = owner_dir / "built" / "aotriton-0.11.2b-gfx908-hip6.mi100-bundle.zip"
        planted.parent.mkdir(parents=True)
        planted.write_bytes(b"planted")
        planted.chmod(0o666)
    else:
        sha = load_spec(default_spec_path()).sha256
        (owner_dir / "trees").mkdir(parents=True)
        (owner_dir / "trees" / f"aotriton-0.11.2b-mi100-{sha[:12]}").symlink_to(other)
    before = snapshot(machine.site)
    r = auto(machine, str(machine.cache / "none"), "--build-locally")
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    assert snapshot(machine.site) == before and list(other.iterdir()) == []


def test_a_failed_validate_restores_torch(machine, dist, monkeypatch):
    """The child validate imports the torch it installed into (PYTHONPATH): this fake one fails it."""
    monkeypatch.setenv("PYTHONPATH", str(machine.site) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = snapshot(machine.site)
    r = auto(machine, str(dist))
    assert r.exit_code == 3, r.output
    assert "then:     bundle check, install into" in r.output and "validate on the card" in r.output
    assert f"installed: {NAME}" in r.output
    assert "validate failed on gfx908" in r.output and "torch is as it was before this command" in r.output
    assert snapshot(machine.site) == before


def test_a_bundle_for_a_newer_glibc_is_built_here_instead(machine, dist):
    index = json.loads((dist / "index.json").read_text())
    for e in index["bundles"]:
        e["glibc"] = "GLIBC_9.99"
    site = site_of(dist)
    site.files["/r/index.json"] = json.dumps(index).encode()
    with serve(site) as s:
        r = auto(machine, s.url("/r/"), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "built here: the index's bundle needs GLIBC_9.99, this machine has GLIBC_" in r.output
