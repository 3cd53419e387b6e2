"""The shared kernel cache (codegen.compile.cache): records checked on read, hostile entries refused,
bounded size, safe under concurrent writers. Fast: no compiler (real compiles through it are in
test_build_compile_service.py and test_precompile_triton.py)."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time

import pytest

from codegen.compile.cache import CompileCache, cache_key


def _key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def test_roundtrip_checks_the_code_object(tmp_path):
    c = CompileCache(tmp_path)
    k = _key(1)
    c.put(k, {"ok": True, "sidecar": "{}"}, b"\x7fELF" + b"x" * 100)
    assert c.get(k)["_hsaco"].startswith(b"\x7fELF")
    (tmp_path / k[:2] / f"{k}.hsaco").write_bytes(b"\x7fELF" + b"y" * 100)  # changed on disk
    assert c.get(k) is None and c.stats["corrupt"] == 1
    assert not (tmp_path / k[:2] / f"{k}.json").exists()  # dropped: the next put recompiles it
    c.put(k, {"ok": True}, b"ok")
    (tmp_path / k[:2] / f"{k}.json").write_text("{ not json")
    assert c.get(k) is None and c.stats["corrupt"] == 2


def test_hostile_entries_are_refused(tmp_path):
    c = CompileCache(tmp_path / "cache")
    for bad in ("../../etc/passwd", "ab", _key(1).upper(), _key(1) + "/x"):
        with pytest.raises(ValueError):
            c.get(bad)
    k = _key(2)
    c.put(k, {"ok": True}, b"image")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"image")
    img = tmp_path / "cache" / k[:2] / f"{k}.hsaco"
    img.unlink()
    img.symlink_to(outside)  # a link out of the cache folder is never followed
    assert c.get(k) is None
    assert outside.read_bytes() == b"image"
    k3 = _key(3)
    c.put(k3, {"ok": True}, b"image")
    rec = tmp_path / "cache" / k3[:2] / f"{k3}.json"
    rec.write_text(rec.read_text().replace(k3, _key(4)))  # a record filed under another key
    assert c.get(k3) is None


@pytest.mark.parametrize("change,corrupt", [
    ({"format": 4}, False),                              # another format's record: a miss, left alone
    ({"ok": "yes"}, True),                               # not a boolean
    ({"compile_s": float("nan")}, True),
    ({"resources": {"vgprs": -1}}, True),
    ({"resources": "many"}, True),
    ({"error": "x" * 100_000}, True),                    # longer than any first error line
    ({"planted": True}, True),                           # a key the model does not know
    ({"hsaco_sha256": "0" * 64}, True),                  # a code object that is not the one it names
])
def test_a_record_that_is_not_the_model_is_a_miss(tmp_path, change, corrupt):
    import json

    c = CompileCache(tmp_path)
    k = _key(5)
    c.put(k, {"ok": True, "id": "k5", "compile_s": 1.5}, b"image")
    rec = tmp_path / k[:2] / f"{k}.json"
    rec.write_text(json.dumps({**json.loads(rec.read_text()), **change}))
    assert c.get(k) is None
    assert c.stats["corrupt"] == int(corrupt) and rec.exists() == (not corrupt)


def test_a_record_put_that_the_model_refuses_is_not_written(tmp_path):
    c = CompileCache(tmp_path)
    k = _key(6)
    c.put(k, {"ok": True, "resources": {"vgprs": 1}}, b"image")   # resources without its counts
    assert not (tmp_path / k[:2]).exists() and c.get(k) is None


def test_evict_keeps_the_most_recently_used(tmp_path):
    c = CompileCache(tmp_path, max_bytes=10**9)
    for i in range(6):
        c.put(_key(i), {"ok": True}, b"z" * 1000)
        old = time.time() - 1000 + i
        os.utime(tmp_path / _key(i)[:2] / f"{_key(i)}.json", (old, old))
    assert c.get(_key(0)) is not None  # a hit is a use
    (tmp_path / _key(0)[:2] / f".{_key(0)}.json.stale").write_bytes(b"x")  # a killed writer's temp file
    stale = time.time() - 7200
    os.utime(tmp_path / _key(0)[:2] / f".{_key(0)}.json.stale", (stale, stale))
    per_entry = c.size() // 6
    removed = c.evict(max_bytes=3 * per_entry)
    assert removed == 3
    left = {k for k in map(_key, range(6)) if c.get(k) is not None}
    assert left == {_key(0), _key(4), _key(5)}
    assert not (tmp_path / _key(0)[:2] / f".{_key(0)}.json.stale").exists()


def _writer(root: str, n: int) -> None:
    c = CompileCache(root, max_bytes=40_000)
    for i in range(n):
        c.put(_key(i), {"ok": True, "id": f"k{i}"}, bytes([i % 256]) * 2000)
        c.get(_key((i * 7) % n))
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
    records = list(tmp_path.rglob("*.json"))
    whole = 0
    for rec in records:  # whatever survived eviction is whole, or detected and dropped: never wrong bytes
        got = c.get(rec.stem)
        if got is not None:
            assert got["_hsaco"] == bytes([int(got["id"][1:]) % 256]) * 2000
            whole += 1
    assert records and whole >= len(records) - 2
    assert c.size() <= 40_000 + 2 * 2100 * 2  # bounded (each writer may add an entry after its last evict)


def test_key_ignores_release_names(tmp_path):
    """Same kernel file under two release folders: one key (0.12b and 0.12.1b share entries)."""
    for rel in ("aotriton-0.12b", "aotriton-0.12.1b"):
        (tmp_path / rel).mkdir()
        (tmp_path / rel / "k.py").write_text("import triton\n")
    kw = dict(kernel_name="k", signature="i32", num_warps=4, num_stages=1, waves_per_eu=1, arch="gfx908",
              warp_size=64, triton_version="3.5.1")
    assert cache_key(source=str(tmp_path / "aotriton-0.12b" / "k.py"), **kw) == \
        cache_key(source=str(tmp_path / "aotriton-0.12.1b" / "k.py"), **kw)
