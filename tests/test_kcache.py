"""The shared kernel cache (codegen.compile.cache): records checked on read against the key's
`KernelIdent` and the code object itself, hostile entries refused, a cache others could write
refused when opened, compile failures never stored, bounded size, safe under concurrent writers.
Fast: no compiler (synthetic code objects laid out as a runtime reads them, test_bundle_stub's;
real compiles through the cache are in test_compile_cache_trust.py, test_build_compile_service.py
and test_precompile_triton.py)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import time
from types import SimpleNamespace

import pytest

from codegen.compile.cache import CompileCache, KernelIdent, check_cache_dir, entry_problem, kernarg_layout, kernel_ident
from codegen.compile.resources import parse_resources
from codegen.core.errors import EXIT_USER, UntrustedStorage
from codegen.formats.elf import AMDGPU_MACH
from codegen.models.cache import CacheRecord
from test_bundle_stub import code_object

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid (chown): needs root")

SIG = "*fp16:16,i32,64"     # a pointer, an i32, a constant; then Triton's scratch pointer
ARGS = [{".offset": 0, ".size": 8, ".value_kind": "global_buffer"}, {".offset": 8, ".size": 4, ".value_kind": "by_value"},
        {".offset": 16, ".size": 8, ".value_kind": "global_buffer"}]
NOTE = {".vgpr_count": 20, ".agpr_count": 4, ".sgpr_count": 11, ".group_segment_fixed_size": 0,
        ".private_segment_fixed_size": 0, ".vgpr_spill_count": 0, ".sgpr_spill_count": 0, ".args": ARGS,
        ".kernarg_segment_align": 8}


def image(**kw) -> bytes:
    note = {**NOTE, **kw.pop("note", {})}
    return code_object(AMDGPU_MACH[kw.pop("arch", "gfx908")], kw.pop("kernel", "k"), kernarg=kw.pop("kernarg", 24),
                       note=note, **kw)


IMAGE = image()


def _key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def ident(i: int = 0, **change) -> KernelIdent:
    kw = dict(sources=_key(i), kernel_name="k", signature=SIG, num_warps=4, num_stages=1, waves_per_eu=2,
              arch="gfx908", warp_size=64, triton_version="3.5.1")
    return KernelIdent(**{**kw, **change})


def record(idt: KernelIdent, img: bytes = IMAGE, side: dict | None = None, **change) -> dict:
    """The record the engine puts for `idt` compiled to `img` (resources by the one parser)."""
    sidecar = {"name": idt.kernel_name, "arch": idt.arch, "warp_size": idt.warp_size, "num_warps": idt.num_warps,
               "num_stages": idt.num_stages, "waves_per_eu": idt.waves_per_eu, "shared": 1024, **(side or {})}
    return {"ok": True, "id": f"k{idt.sources[:6]}", "compile_s": 1.0, "sidecar": json.dumps(sidecar),
            "resources": parse_resources("", img, 1024).model_dump(), **change}


def put(c: CompileCache, idt: KernelIdent, img: bytes = IMAGE, **kw) -> None:
    c.put(idt, record(idt, img, **kw), img)


def entry(c: CompileCache, idt: KernelIdent, suffix: str):
    return c.root / idt.key[:2] / f"{idt.key}{suffix}"


def test_roundtrip_checks_the_code_object(tmp_path):
    c = CompileCache(tmp_path)
    k = ident(1)
    put(c, k)
    assert c.get(k)["_hsaco"] == IMAGE
    data = bytearray(IMAGE)
    data[len(data) // 2] ^= 0xFF
    entry(c, k, ".hsaco").write_bytes(bytes(data))  # changed on disk
    assert c.get(k) is None and c.stats["corrupt"] == 1
    assert not entry(c, k, ".json").exists()  # dropped: the next put recompiles it
    put(c, k)
    entry(c, k, ".json").write_text("{ not json")
    assert c.get(k) is None and c.stats["corrupt"] == 2


def test_hostile_entries_are_refused(tmp_path):
    c = CompileCache(tmp_path / "cache")
    for bad in ("../../etc/passwd", "ab", _key(1).upper(), _key(1) + "/x"):  # a key is sha256 hex, or refused
        with pytest.raises(ValueError):
            c.get(SimpleNamespace(key=bad))
    k = ident(2)
    put(c, k)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(IMAGE)
    img = entry(c, k, ".hsaco")
    img.unlink()
    img.symlink_to(outside)  # a link out of the cache folder is never followed
    assert c.get(k) is None
    assert outside.read_bytes() == IMAGE
    put(c, k)  # the link itself is replaced, never written through
    assert not img.is_symlink() and outside.read_bytes() == IMAGE and c.get(k) is not None
    k3 = ident(3)
    put(c, k3)
    rec = entry(c, k3, ".json")
    rec.write_text(rec.read_text().replace(k3.key, _key(4)))  # a record filed under another key
    assert c.get(k3) is None and c.problems[-1] == (k3.key, "a record filed under another key")


@pytest.mark.parametrize("change,corrupt", [
    ({"format": 4}, False),                              # another format's record: a miss, left alone
    ({"ok": False}, False),                              # a failure another run stored (or planted): a miss
    ({"ok": "yes"}, True),                               # not a boolean
    ({"compile_s": float("nan")}, True),
    ({"resources": {"vgprs": -1}}, True),
    ({"resources": "many"}, True),
    ({"error": "x" * 100_000}, True),                    # longer than any first error line
    ({"planted": True}, True),                           # a key the model does not know
    ({"hsaco_sha256": "0" * 64}, True),                  # a code object that is not the one it names
])
def test_a_record_that_is_not_the_model_is_a_miss(tmp_path, change, corrupt):
    c = CompileCache(tmp_path)
    k = ident(5)
    put(c, k)
    rec = entry(c, k, ".json")
    rec.write_text(json.dumps({**json.loads(rec.read_text()), **change}))
    assert c.get(k) is None
    assert c.stats["corrupt"] == int(corrupt) and rec.exists() == (not corrupt)


def test_a_record_put_that_the_model_refuses_is_not_written(tmp_path):
    c = CompileCache(tmp_path)
    k = ident(6)
    c.put(k, {"ok": True, "resources": {"vgprs": 1}}, IMAGE)   # resources without its counts
    assert not (tmp_path / k.key[:2]).exists() and c.get(k) is None


def _swap(what: str) -> tuple[KernelIdent, bytes, dict]:
    """An entry whose code object (or record) is not what the key compiles to: (key, object, sidecar change)."""
    k = ident(7)
    return {
        "kernel name": (k, image(kernel="other"), {}),
        "arch": (k, image(arch="gfx90a"), {}),
        "xnack": (k, image(features=0x300 | 0x400), {}),
        "metadata target": (k, image(target="amdgcn-amd-amdhsa--gfx90a"), {}),
        "wave size": (k, image(wave=32), {}),
        "num_warps": (k, image(max_wg=512), {}),
        "an argument less": (k, image(note={".args": ARGS[:1] + ARGS[2:]}), {}),
        "an i64 for the i32": (k, image(note={".args": [ARGS[0], {**ARGS[1], ".size": 8}, ARGS[2]]}), {}),
        "three Triton pointers": (k, image(kernarg=40, note={".args": ARGS + [{**ARGS[2], ".offset": o} for o in (24, 32)]}), {}),
        "kernarg size": (k, image(kernarg=32), {}),
        "sidecar num_stages": (k, IMAGE, {"num_stages": 3}),
        "sidecar name": (k, IMAGE, {"name": "other"}),
    }[what]


@pytest.mark.parametrize("what", ["kernel name", "arch", "xnack", "metadata target", "wave size", "num_warps",
                                  "an argument less", "an i64 for the i32", "three Triton pointers", "kernarg size",
                                  "sidecar num_stages", "sidecar name"])
def test_an_entry_is_bound_to_its_key(tmp_path, what):
    """Another kernel's or variant's code object under a key, its sha256 recomputed: dropped,
    counted corrupt, never served."""
    k, img, side = _swap(what)
    c = CompileCache(tmp_path)
    put(c, k, img, side=side)
    assert entry(c, k, ".json").exists()           # put stores what it is given (it came from the compiler)
    assert c.get(k) is None and c.stats["corrupt"] == 1, what
    assert not entry(c, k, ".json").exists() and c.problems[0][0] == k.key
    put(c, k)
    assert c.get(k)["_hsaco"] == IMAGE              # recompiled: served again


def test_the_resources_a_record_states_are_the_code_objects():
    k = ident(8)
    rec = CacheRecord.model_validate({**record(k), "format": 5, "key": k.key})
    assert entry_problem(k, rec, IMAGE) is None
    for field, value in (("vgprs", 19), ("agprs", 0), ("sgpr_spills", 3), ("lds_bytes", 0), ("wavefront_size", 32)):
        bad = rec.model_copy(update={"resources": rec.resources.model_copy(update={field: value})})
        assert entry_problem(k, bad, IMAGE) == f"resources ['{field}'] differ from the code object's metadata note"


def test_llvms_hidden_arguments_follow_the_signatures():
    """A kernel that reads its grid gets LLVM's implicit arguments after its own: a block of at
    most 256 bytes (code object v5) that starts where the explicit ones end."""
    k = ident(8)
    hidden = [{".offset": 24, ".size": 4, ".value_kind": "hidden_block_count_x"},
              {".offset": 120, ".size": 4, ".value_kind": "hidden_dynamic_lds_size"}]
    for kernarg, args, ok in ((280, ARGS + hidden, True), (128, ARGS + hidden, True), (300, ARGS + hidden, False),
                              (120, ARGS + hidden, False), (280, ARGS[:2] + hidden, False)):
        img = image(kernarg=kernarg, note={".args": args})
        rec = CacheRecord.model_validate({**record(k, img), "format": 5, "key": k.key})
        assert (entry_problem(k, rec, img) is None) == ok, (kernarg, args)


def test_kernarg_layout_follows_the_signature():
    assert kernarg_layout("*fp16:16, i32, 64, u64:8, fp16, *fp32:16, i32:1, True") == [
        ("global_buffer", 0, 8), ("by_value", 8, 4), ("by_value", 16, 8), ("by_value", 24, 2),
        ("global_buffer", 32, 8)]
    assert kernarg_layout("*fp16, x9, i32") == [("global_buffer", 0, 8), ("by_value", None, None), ("by_value", None, None)]


def test_a_compile_failure_is_this_runs_only(tmp_path):
    """A failure is served by the cache that saw it; another run compiles the kernel again, and a
    failure record found on disk (a planted `ok: false`) is a miss that a good compile replaces."""
    k = ident(9)
    c = CompileCache(tmp_path)
    c.put(k, {"ok": False, "id": "k9", "error": "OutOfResources: shared memory"}, None)
    assert c.get(k)["error"] == "OutOfResources: shared memory" and not list(tmp_path.rglob("*.json"))
    assert CompileCache(tmp_path).get(k) is None
    put(c, k)
    rec = entry(c, k, ".json")
    rec.write_text(json.dumps({**json.loads(rec.read_text()), "ok": False, "error": "planted"}))
    fresh = CompileCache(tmp_path)
    assert fresh.get(k) is None and fresh.stats == {**fresh.stats, "misses": 1, "corrupt": 0}
    put(fresh, k)
    assert CompileCache(tmp_path).get(k)["ok"] is True


def _refused(root, *words: str) -> None:
    with pytest.raises(UntrustedStorage) as exc:
        CompileCache(root)
    assert exc.value.exit_code == EXIT_USER and all(w in str(exc.value) for w in words), str(exc.value)
    assert "--cache-dir" in exc.value.hint and "\n" not in str(exc.value)


@pytest.mark.parametrize("how", ["group-writable", "others-writable", "a link", "a subfolder link",
                                 "a writable subfolder"])
def test_a_cache_others_could_write_is_refused_when_opened(tmp_path, how):
    root = tmp_path / "kernels"
    c = CompileCache(root)
    put(c, ident(10))
    sub = root / ident(10).key[:2]
    if how == "group-writable":
        if os.geteuid() != 0:
            pytest.skip("gives the folder to another group (chown): needs root")
        os.chmod(root, 0o775)
        os.chown(root, os.geteuid(), 4242)  # a group that is not the user's private group
        words = "kernel cache folder is writable by group (mode 0775)"
    elif how == "others-writable":
        os.chmod(root, 0o757)
        words = "kernel cache folder is writable by others (mode 0757)"
    elif how == "a link":
        root.rename(tmp_path / "real")
        root.symlink_to(tmp_path / "real")
        words = "kernel cache folder is a symbolic link"
    elif how == "a subfolder link":
        sub.rename(tmp_path / "elsewhere")
        sub.symlink_to(tmp_path / "elsewhere")
        words = "kernel cache subfolder is a symbolic link"
    else:
        os.chmod(sub, 0o777)
        words = ("kernel cache subfolder is writable by", "others (mode 0777)")  # and group, unless your private one
    _refused(root, *(words if isinstance(words, tuple) else (words,)))
    with pytest.raises(UntrustedStorage):
        check_cache_dir(root)


@needs_root
def test_another_users_cache_and_entries(tmp_path):
    root = tmp_path / "kernels"
    k = ident(11)
    put(CompileCache(root), k)
    c = CompileCache(root)
    os.chown(entry(c, k, ".json"), 4242, 4242)
    assert c.get(k) is None and c.stats["misses"] == 1 and entry(c, k, ".json").exists()  # never read: a miss
    put(c, k)  # replaced by a record of ours (a rename, never a write into theirs)
    assert entry(c, k, ".json").stat().st_uid == os.geteuid() and c.get(k) is not None
    os.chown(entry(c, k, ".hsaco"), 4242, 4242)
    assert c.get(k) is None and c.stats["corrupt"] == 1  # its code object never read: the record is dropped
    os.chown(root, 4242, 4242)
    _refused(root, "kernel cache folder belongs to uid 4242")


def test_a_sticky_cache_of_yours_may_be_shared(tmp_path):
    """Others may add to a sticky folder of yours, never replace what is yours: allowed; an entry
    file another user put there (or one others may write) is never read."""
    root = tmp_path / "kernels"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o1777)
    c = CompileCache(root)
    k = ident(12)
    put(c, k)
    assert c.get(k) is not None
    os.chmod(entry(c, k, ".json"), 0o666)
    assert c.get(k) is None and c.stats["misses"] == 1  # never read
    put(c, k)
    assert c.get(k) is not None


def test_a_subfolder_that_became_a_link_is_never_written_through(tmp_path):
    root, elsewhere = tmp_path / "kernels", tmp_path / "elsewhere"
    elsewhere.mkdir()
    c = CompileCache(root)
    k = ident(13)
    (root / k.key[:2]).symlink_to(elsewhere)   # after the cache was opened
    put(c, k)
    assert list(elsewhere.iterdir()) == [] and c.stats["refused"] == 1 and c.get(k) is None


def test_evict_keeps_the_most_recently_used(tmp_path):
    c = CompileCache(tmp_path, max_bytes=10**9)
    keys = [ident(i) for i in range(6)]
    for i, k in enumerate(keys):
        put(c, k)
        old = time.time() - 1000 + i
        os.utime(entry(c, k, ".json"), (old, old))
    assert c.get(keys[0]) is not None  # a hit is a use
    stale_tmp = entry(c, keys[0], ".json").with_name(f".{keys[0].key}.json.stale")
    stale_tmp.write_bytes(b"x")  # a killed writer's temp file
    stale = time.time() - 7200
    os.utime(stale_tmp, (stale, stale))
    per_entry = c.size() // 6
    removed = c.evict(max_bytes=3 * per_entry)
    assert removed == 3
    left = {k.key for k in keys if c.get(k) is not None}
    assert left == {keys[0].key, keys[4].key, keys[5].key}
    assert not stale_tmp.exists()


def test_evict_never_locks_through_a_link(tmp_path):
    c = CompileCache(tmp_path / "kernels")
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / "kernels" / ".evict.lock").symlink_to(victim)
    assert c.evict(max_bytes=0) == 0 and victim.read_text() == "mine"


def _writer(root: str, n: int) -> None:
    c = CompileCache(root, max_bytes=40_000)
    for i in range(n):
        put(c, ident(i))
        c.get(ident((i * 7) % n))
    c.evict()


def test_two_concurrent_writers(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 64)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    c = CompileCache(tmp_path)
    by_key = {ident(i).key: ident(i) for i in range(64)}
    records = list(tmp_path.rglob("*.json"))
    whole = 0
    for rec in records:  # whatever survived eviction is whole, or detected and dropped: never wrong bytes
        got = c.get(by_key[rec.stem])
        if got is not None:
            assert got["_hsaco"] == IMAGE and got["key"] == rec.stem
            whole += 1
    assert records and whole >= len(records) - 2
    size = len(IMAGE) + 2000
    assert c.size() <= 40_000 + 2 * size * 2  # bounded (each writer may add an entry after its last evict)


def test_key_ignores_release_names(tmp_path):
    """Same kernel file under two release folders: one key (0.12b and 0.12.1b share entries)."""
    for rel in ("aotriton-0.12b", "aotriton-0.12.1b"):
        (tmp_path / rel).mkdir()
        (tmp_path / rel / "k.py").write_text("import triton\n")
    kw = dict(kernel_name="k", signature="i32", num_warps=4, num_stages=1, waves_per_eu=1, arch="gfx908",
              warp_size=64, triton_version="3.5.1")
    assert kernel_ident(source=str(tmp_path / "aotriton-0.12b" / "k.py"), **kw).key == \
        kernel_ident(source=str(tmp_path / "aotriton-0.12.1b" / "k.py"), **kw).key
