"""Issue 30 item 4: the kernel cache trusts what it stores. Each attack found, as an integration
test: real code objects compiled for gfx908 by pip Triton on the CPU (marked `triton`: two small
kernels in four variants, compiled once per module, ~10 s), through precompile's engine
(codegen.compile.engine) or the CLI; then a property test (hypothesis) over the cache's entries
and folders: random bytes, mutated records, links, modes. Each case ends in a refusal when the
cache is opened (one message, exit 2), a miss or a hit whose entry passes every check, and
nothing outside the cache folder changes. Default run: 30 cases; `-m slow`: 1,000."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from fuzz_profiles import fast, slow
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import test_kcache as kcache
from codegen.cli import app
from codegen.compile.cache import CompileCache, entry_problem
from codegen.compile.engine import compile_entries, entry_ident
from codegen.core.errors import EXIT_USER, UntrustedStorage, UserError
from codegen.formats.elf import loaded_digest
from codegen.formats.spec import load_spec
from codegen.models import KernelConfig
from codegen.models.cache import CacheRecord
from codegen.plan.kernel_list import KernelEntry
from test_fuzz_data_files import _encode, _mutate
from test_precompile_triton import KERNELS as TILE_KERNELS

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs triton in this (test) venv: pip install -e '.[upstream]'")

KERNELS = TILE_KERNELS + '''

@triton.jit
def copy_rows(X, Y, n, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    if SCALE:
        x = x * 2.0
    tl.store(Y + offs, x, mask=offs < n)
'''
DOT = "*fp16:16, *fp16:16, *fp32:16, i32, 32, 32, 32"
COPY = "*fp32:16, *fp32:16, i32, 64, {scale}"
# two kernels, and two variants: the same tile with other options (num_warps, waves_per_eu), the
# same kernel with another flag (a constexpr)
VARIANTS = {"dot": ("tile_dot", DOT, 4, 2), "dot-w8": ("tile_dot", DOT, 8, 1),
            "copy": ("copy_rows", COPY.format(scale="False"), 4, 2), "copy-x2": ("copy_rows", COPY.format(scale="True"), 4, 2)}


def _entry(kid: str) -> KernelEntry:
    kernel, sig, warps, wpe = VARIANTS[kid]
    return KernelEntry(id=kid, config=KernelConfig(kernel, "gfx908", "fp16", None, None, None, wpe, warps, 1),
                       hsaco=f"img/{kid}.hsaco", source="src/kernels.py", kernel_name=kernel, signature=sig,
                       perf="", functional="")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A tree of the kernels and a cache the engine filled with the four variants: (tree, cache, idents, objects)."""
    base = tmp_path_factory.mktemp("kcache-real")
    tree = base / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "kernels.py").write_text(KERNELS)
    spec = load_spec(None).spec
    entries = [_entry(k) for k in VARIANTS]
    run = compile_entries(tree, entries, spec, jobs=2, timeout_s=240, cache=CompileCache(base / "cache"),
                          keep=base / "keep")
    assert [r.status for r in run.results] == ["ok"] * 4, [r.error for r in run.results]
    idents = {e.id: entry_ident(tree.resolve(), e, spec.warp_size, run.triton) for e in entries}
    objects = {k: (base / "keep" / "img" / f"{k}.hsaco").read_bytes() for k in VARIANTS}
    return tree, base / "cache", idents, objects


@pytest.fixture
def cache(compiled, tmp_path):
    """A copy of the filled cache, to tamper with."""
    tree, filled, idents, objects = compiled
    root = tmp_path / "kernels"
    shutil.copytree(filled, root, symlinks=True)
    return root


def _files(root: Path, ident) -> tuple[Path, Path]:
    return root / ident.key[:2] / f"{ident.key}.json", root / ident.key[:2] / f"{ident.key}.hsaco"


def _plant(root: Path, victim, donor, whole: bool) -> None:
    """The donor's code object under the victim's key, its sha256 recomputed in the victim's record
    (`whole`: the donor's record too, its key rewritten): what anyone who can write the cache can do."""
    vjson, vobj = _files(root, victim)
    djson, dobj = _files(root, donor)
    rec = json.loads((djson if whole else vjson).read_text())
    rec.update(key=victim.key, hsaco_sha256=hashlib.sha256(dobj.read_bytes()).hexdigest())
    vobj.write_bytes(dobj.read_bytes())
    vjson.write_text(json.dumps(rec))


def _compile(compiled, root: Path, kid: str = "dot"):
    tree, _filled, _idents, _objects = compiled
    cache = CompileCache(root)
    keep = root.parent / "keep"
    run = compile_entries(tree, [_entry(kid)], load_spec(None).spec, jobs=1, timeout_s=240, cache=cache, keep=keep)
    return run, cache, (keep / "img" / f"{kid}.hsaco").read_bytes()


@pytest.mark.parametrize("victim,donor,whole,why", [
    ("copy", "copy-x2", False, "resources"),      # the same kernel with another flag: its object only
    ("dot", "dot-w8", False, "workgroup of 512 lanes"),
    ("dot", "dot-w8", True, "workgroup of 512 lanes"),  # the other options' whole entry
    ("dot", "copy", True, "kernels ['copy_rows'] in the code object, the key's is tile_dot"),
], ids=["another-flag", "other-options-object", "other-options-entry", "another-kernel"])
@pytest.mark.triton
@needs_triton
def test_another_variants_object_under_a_key_is_never_served(compiled, cache, victim, donor, whole, why):
    """Another variant's (or kernel's) code object under a key, its sha256 recomputed: dropped,
    counted corrupt, never served."""
    _tree, _filled, idents, _objects = compiled
    _plant(cache, idents[victim], idents[donor], whole)
    c = CompileCache(cache)
    assert c.get(idents[victim]) is None and c.stats["corrupt"] == 1
    assert why in c.problems[0][1], c.problems
    assert not _files(cache, idents[victim])[0].exists()   # dropped
    assert c.get(idents[donor]) is not None               # the donor's own entry is untouched


@pytest.mark.triton
@needs_triton
def test_precompile_compiles_again_what_another_kernels_entry_claims(compiled, cache):
    """`precompile` served another kernel's object as cached: now the entry is dropped, the kernel
    compiled, and its code object is the kernel's own."""
    _tree, _filled, idents, objects = compiled
    _plant(cache, idents["dot"], idents["copy"], whole=True)
    run, c, image = _compile(compiled, cache)
    assert (run.compiled_now, run.from_cache, c.stats["corrupt"]) == (1, 0, 1)
    assert run.results[0].status == "ok" and loaded_digest(image) == loaded_digest(objects["dot"])
    run, c, image = _compile(compiled, cache)      # and the entry the compile put back is served
    assert (run.compiled_now, run.from_cache) == (0, 1) and loaded_digest(image) == loaded_digest(objects["dot"])


@pytest.mark.triton
@needs_triton
def test_a_planted_failure_does_not_fail_a_good_kernel(compiled, cache):
    _tree, _filled, idents, _objects = compiled
    rec_path = _files(cache, idents["dot"])[0]
    rec = json.loads(rec_path.read_text())
    rec.update(ok=False, error="CompilationError: planted")
    rec_path.write_text(json.dumps(rec))
    run, c, _image = _compile(compiled, cache)
    assert run.results[0].status == "ok" and run.compiled_now == 1 and c.stats["misses"] == 1
    assert json.loads(rec_path.read_text())["ok"] is True


@pytest.mark.triton
@needs_triton
def test_a_symlinked_subfolder_is_refused_and_never_written_through(compiled, cache, tmp_path):
    _tree, _filled, idents, _objects = compiled
    sub = cache / idents["dot"].key[:2]
    elsewhere = tmp_path / "elsewhere"
    sub.rename(elsewhere)
    sub.symlink_to(elsewhere)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    with pytest.raises(UntrustedStorage, match="kernel cache subfolder is a symbolic link"):
        CompileCache(cache)
    sub.unlink()                                   # a link put there after the cache was opened
    c = CompileCache(cache)
    sub.symlink_to(elsewhere)
    for p in elsewhere.iterdir():
        p.write_bytes(b"stale")
    run = compile_entries(_tree, [_entry("dot")], load_spec(None).spec, jobs=1, timeout_s=240, cache=c)
    assert run.compiled_now == 1 and run.results[0].status == "ok" and c.stats["refused"] == 1
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == {n: b"stale" for n in before}


def _cli(args: list, **env) -> object:
    r = CliRunner().invoke(app, [str(a) for a in args], env=env)
    assert "Traceback" not in r.output and r.exit_code == EXIT_USER, (r.exit_code, r.output)
    return r


@pytest.mark.parametrize("how", ["group-writable", "a link"])
def test_build_and_precompile_refuse_a_cache_others_could_write_before_any_work(tmp_path, how):
    root = tmp_path / "shared" / "kernels"
    root.mkdir(parents=True)
    if how == "group-writable":
        os.chmod(root, 0o770)
        if os.geteuid() == 0:
            os.chown(root, 0, 4242)     # a group that is not the user's private group
        words, fix = "kernel cache folder is writable by group (mode 0770)", f"chmod go-w {root}"
    else:
        real = tmp_path / "real"
        root.rename(real)
        root.symlink_to(real)
        words, fix = "kernel cache folder is a symbolic link", "use the real path"
    tree = tmp_path / "tree"
    tree.mkdir()
    before = _snapshot(tmp_path)
    for r in (_cli(["build", tree, "--prefix", tmp_path / "p", "--cache-dir", root]),
              _cli(["precompile", tree, "--python", sys.executable], MI100_CODEGEN_CACHE=str(root.parent)),
              _cli(["bundle", "build", tree, "--hip", "6", "--out", tmp_path / "out", "--cache-dir", root])):
        out = " ".join(r.output.split())
        assert words in out and fix in out and "--cache-dir" in out, out
    assert _snapshot(tmp_path) == before  # nothing created: no build folder, no venv, no output


# --- property test: whatever the cache folder holds ----------------------------------------------
IDENT = kcache.ident(1)
RECORD = {**kcache.record(IDENT), "format": 5, "key": IDENT.key,
          "hsaco_sha256": hashlib.sha256(kcache.IMAGE).hexdigest()}
PLACES = ["root", "sub", "json", "hsaco"]


@st.composite
def tamperings(draw):
    out = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["record", "record-bytes", "object", "rehash", "link", "mode", "fifo", "owner"]))
        if kind == "record":
            out.append((kind, _encode(draw, _mutate(draw, copy.deepcopy(RECORD)))))
        elif kind == "record-bytes":
            out.append((kind, draw(st.binary(max_size=64))))
        elif kind == "object":
            img = bytearray(kcache.IMAGE)
            for _ in range(draw(st.integers(1, 3))):
                img[draw(st.integers(0, len(img) - 1))] = draw(st.integers(0, 255))
            out.append((kind, bytes(img[:draw(st.integers(0, len(img)))])))
        elif kind == "link":
            out.append((kind, (draw(st.sampled_from(PLACES)), draw(st.sampled_from(["file", "dir", "dangling", "loop"])))))
        elif kind == "mode":
            out.append((kind, (draw(st.sampled_from(PLACES)), draw(st.integers(0, 0o7777)))))
        elif kind in ("fifo", "owner"):
            out.append((kind, draw(st.sampled_from(PLACES[1:]))))
        else:
            out.append((kind, None))
    return out


def _snapshot(d: Path) -> dict:
    out = {}
    for p in sorted(d.rglob("*")):
        st_ = p.lstat()
        out[str(p.relative_to(d))] = (st_.st_mode, st_.st_uid, os.readlink(p) if p.is_symlink()
                                      else p.read_bytes() if stat.S_ISREG(st_.st_mode) else None)
    return out


def _tamper(root: Path, outside: Path, steps) -> None:
    sub = root / IDENT.key[:2]
    where = {"root": root, "sub": sub, "json": sub / f"{IDENT.key}.json", "hsaco": sub / f"{IDENT.key}.hsaco"}
    for kind, arg in steps:
        if kind in ("record", "record-bytes", "object", "rehash") and (where["json"].is_fifo() or where["hsaco"].is_fifo()):
            continue  # the test itself never waits on a FIFO it made
        try:
            if kind in ("record", "record-bytes"):
                where["json"].write_bytes(arg)
            elif kind == "object":
                where["hsaco"].write_bytes(arg)
            elif kind == "rehash":
                rec = json.loads(where["json"].read_text())
                if isinstance(rec, dict):
                    rec["hsaco_sha256"] = hashlib.sha256(where["hsaco"].read_bytes()).hexdigest()
                    where["json"].write_text(json.dumps(rec))
            elif kind == "link":
                place, to = arg
                p = where[place]
                if place != "root":
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
                else:
                    p.rename(outside / "moved-root")
                p.symlink_to({"file": outside / "victim", "dir": outside, "dangling": outside / "none", "loop": p}[to])
            elif kind == "mode":
                os.chmod(where[arg[0]], arg[1], follow_symlinks=False)
            elif kind == "fifo":
                p = where[arg]
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
                os.mkfifo(p)
            elif kind == "owner" and os.geteuid() == 0:
                os.chown(where[arg], 4242, 4242, follow_symlinks=False)
        except (OSError, ValueError, RecursionError, NotImplementedError):
            pass  # a step the earlier ones made impossible


def _waited(*_args) -> None:
    raise TimeoutError("the cache waited 60 s on something it opened")


def _cache_case(steps) -> None:
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        root, outside = d / "kernels", d / "outside"
        outside.mkdir()
        (outside / "victim").write_bytes(b"not the cache's")
        kcache.put(CompileCache(root), IDENT)
        _tamper(root, outside, steps)
        before = _snapshot(outside)
        handler = signal.signal(signal.SIGALRM, _waited)
        signal.alarm(60)  # a read that waits on a FIFO fails the case instead of hanging the run
        try:
            try:
                c = CompileCache(root)
            except UserError as exc:               # refused when opened: one message, exit 2
                assert exc.exit_code == EXIT_USER and "\n" not in str(exc), str(exc)
            else:
                got = c.get(IDENT)
                if got is not None:                # a hit is an entry that passes every check
                    rec = CacheRecord.model_validate({k: v for k, v in got.items() if k != "_hsaco"})
                    assert got["key"] == IDENT.key and entry_problem(IDENT, rec, got["_hsaco"]) is None
                kcache.put(c, IDENT)               # a recompile's write, then an eviction
                c.evict(max_bytes=0)
                got = c.get(IDENT)
                assert got is None or got["_hsaco"] == kcache.IMAGE
            assert _snapshot(outside) == before and sorted(p.name for p in d.iterdir()) == ["kernels", "outside"]
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, handler)
            for p in [d, *d.rglob("*")]:
                if not p.is_symlink() and p.exists() and not p.is_fifo():
                    os.chmod(p, 0o755)


def test_whatever_the_cache_holds():
    @fast(30)
    @given(tamperings())
    def run(steps):
        _cache_case(steps)

    run()


@pytest.mark.slow
def test_whatever_the_cache_holds_slow():
    @slow(1000)
    @given(tamperings())
    def run(steps):
        _cache_case(steps)

    run()
