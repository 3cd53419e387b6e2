"""build's compile service (warm workers behind the thin client the build venv runs in place of
the tree's compile.py) against the tree's own compile.py, through real ninja edges written the way
upstream's CMake writes them (scripts/bench_build_compile.py's write_kernel_ninja), with real Triton compiles of a real AOTriton
kernel (0.11b's bwd_preprocess and a small attn_fwd, 1-4 s each). Marked aotriton + triton; the
default-run ones ~1 min on 2 busy cores; the builder wiring, the two-folder comparison and Dask
(which CI does not install) are also `slow`."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

from codegen.compile.service import CompileService, parse_request
from codegen.imagebuild.configure import prepare_venv
from codegen.imagebuild.prereq import Toolchain
from codegen.compile.cache import CompileCache
from codegen.models import KernelConfig
from codegen.plan.kernel_list import KernelEntry
from codegen.compile.engine import triton_version

CMAKE, NINJA = shutil.which("cmake"), shutil.which("ninja")
_BENCH = importlib.util.spec_from_file_location(
    "_script_bench_build_compile", Path(__file__).resolve().parents[1] / "scripts" / "bench_build_compile.py")
bench = importlib.util.module_from_spec(_BENCH)
_BENCH.loader.exec_module(bench)
write_kernel_ninja = bench.write_kernel_ninja   # upstream's per-kernel ninja edges, as its CMake writes them
pytestmark = [
    pytest.mark.aotriton, pytest.mark.triton,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton in this (test) venv"),
    pytest.mark.skipif(not (CMAKE and NINJA), reason="needs cmake and ninja (apt-get install -y cmake ninja-build)"),
]

ARCH = "gfx90a"  # a target the pristine compile.py knows (gfx908 is the overlay's addition)
SIG = "*{d}:16, *{d}:16, *fp32:16, u64:8, u64:8, u64:8, 1, u64:8, u64:8, u64:8, 1, i32, i32, 128, 64, {v}"
KERNELS = [(d, v) for d in ("fp16", "bf16") for v in ("False", "True")]
# attn_fwd (16x16 tile, 0.11b's smoke-spec signature): its hints mix 8 and 16 out of order, which
# Triton's metadata hash sees (the order compile.py builds them in)
FWD_SIG = ("*bf16:16, *bf16:16, *bf16:16, 0, 0, fp32, *fp32:16, *bf16:16, 0, 0, 0, 0, 0, u64:8, u64:8, u64:8, 1, "
           "u64:8, u64:8, u64:8, 1, u64:8, u64:8, u64:8, 1, u64:8, u64:8, u64:8, 1, 0, 0, 0, 1, 0, 1, i32, i32, i32, "
           "*i32:16, *i32:16, i32, i32, 64, 64, False, False, 0, 0, 0, 0, 0, 0, False, 0, 0, 0, 0, 0, False, False, "
           "False, False, 0, 0, i32, 2, i32, 16, 16, False")


def _fwd_entry() -> KernelEntry:
    return KernelEntry(id="attn_fwd-bf16", config=KernelConfig("attn_fwd", ARCH, "bf16", 64, 16, 16, 2, 4, 1),
                       hsaco="flash/img/attn_fwd-bf16.hsaco", source="tritonsrc/flash.py", kernel_name="attn_fwd",
                       signature=FWD_SIG, perf="", functional="")


def _entries(n: int) -> list[KernelEntry]:
    out = []
    for d, v in KERNELS[:n]:
        kid = f"bwd_preprocess-{d}-{v}"
        out.append(KernelEntry(id=kid, config=KernelConfig("bwd_preprocess", ARCH, d, 64, 128, None, 2, 4, 1),
                               hsaco=f"flash/img/{kid}.hsaco", source="tritonsrc/flash.py",
                               kernel_name="bwd_preprocess", signature=SIG.format(d=d, v=v), perf="", functional=""))
    return out


@pytest.fixture
def small_tree(pristine_tree, tmp_path):
    """The tree's compiler driver and Triton sources, copied (the upstream route writes bytecode)."""
    src = pristine_tree("0.11b")
    tree = tmp_path / "tree"
    shutil.copytree(src / "tritonsrc", tree / "tritonsrc", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "v3python").mkdir()
    shutil.copy2(src / "v3python" / "compile.py", tree / "v3python" / "compile.py")
    return tree


def _build_dir(tmp_path: Path, name: str, tree: Path, entries: list[KernelEntry]) -> Path:
    b = tmp_path / name
    b.mkdir()
    tc = Toolchain(cmake=CMAKE, cmake_version="", ninja=NINJA, ninja_version="", cxx="", cc="", hip_dir=None,
                   hip_version=None, python=sys.executable, site_packages=(sysconfig.get_path("purelib"),))
    venv = prepare_venv(b, tc)
    write_kernel_ninja(b, tree, tree / "v3python" / "compile.py", venv, entries, cmake=CMAKE)
    return b


def _ninja(b: Path, env: dict | None = None, jobs: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run([NINJA, "-C", str(b), "-j", str(jobs)], env={**os.environ, **(env or {})},
                          capture_output=True, text=True)


def _outputs(b: Path) -> dict[str, str]:
    return {p.relative_to(b).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((b / "flash").rglob("*")) if p.is_file()}


def _service(cache, jobs=2) -> CompileService:
    return CompileService(jobs=jobs, python=sys.executable, triton=triton_version(), arch=ARCH, warp_size=64,
                          cache=cache)


def test_service_is_byte_identical_to_compile_py_and_caches(small_tree, tmp_path):
    entries = _entries(1) + [_fwd_entry()]
    up = _build_dir(tmp_path, "up", small_tree, entries)
    r = _ninja(up)
    assert r.returncode == 0, r.stdout + r.stderr
    ours = _build_dir(tmp_path, "ours", small_tree, entries)
    cache = CompileCache(tmp_path / "kcache")
    with _service(cache) as svc:
        r = _ninja(ours, svc.env())
        stats = svc.stats
    assert r.returncode == 0, r.stdout + r.stderr
    assert (stats.compiled, stats.cached, stats.declined) == (2, 0, 0)
    # the image and Triton's metadata sidecar, byte for byte (same interpreter, same Triton)
    assert _outputs(up) == _outputs(ours) and len(_outputs(ours)) == 4
    assert not list(ours.rglob("*.mi100-part*"))

    # a re-run after the outputs are gone: every kernel from the cache, still identical
    shutil.rmtree(ours / "flash")
    for e in entries:
        (ours / e.hsaco).parent.mkdir(parents=True, exist_ok=True)
    # a corrupt entry (its code object changed on disk) is detected and compiled again
    victim = next(p for p in (tmp_path / "kcache").rglob("*.hsaco"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with _service(CompileCache(tmp_path / "kcache")) as svc:
        r = _ninja(ours, svc.env())
        stats, cstats = svc.stats, svc.cache.stats
    assert r.returncode == 0, r.stdout + r.stderr
    assert (stats.compiled, stats.cached) == (1, 1) and cstats["corrupt"] == 1
    assert _outputs(up) == _outputs(ours)

    # ninja's own tracking: nothing left to do, the service is not asked
    with _service(CompileCache(tmp_path / "kcache")) as svc:
        r = _ninja(ours, svc.env())
        assert "no work to do" in r.stdout and svc.stats.compiled + svc.stats.cached == 0


@pytest.mark.slow
def test_only_debug_sections_name_the_tree(small_tree, tmp_path):
    """The same kernel compiled from two folders (two trees sharing a cache entry): the loaded
    sections are identical, the DWARF sections name the folder."""
    from codegen.formats.elf import loaded_digest
    from codegen.compile.engine import compile_entries
    from codegen.formats.spec import load_spec

    spec = load_spec(None).spec.model_copy(update={"arch": ARCH})
    other = tmp_path / "other"
    shutil.copytree(small_tree, other)
    e = _fwd_entry()
    images = []
    for t in (small_tree, other):  # one worker process each (a process imports a kernel module once)
        compile_entries(t, [e], spec, jobs=1, timeout_s=240, cache=None, keep=tmp_path / f"keep-{t.name}")
        images.append((tmp_path / f"keep-{t.name}" / e.hsaco).read_bytes())
    a, b = images
    assert a != b and loaded_digest(a) == loaded_digest(b)
    assert str(small_tree / "tritonsrc").encode() in a and str(other / "tritonsrc").encode() in b


def test_precompile_entries_serve_build(small_tree, tmp_path):
    """A kernel precompile compiled (same cache) is not compiled again by build's service."""
    from codegen.compile.engine import compile_entries
    from codegen.formats.spec import load_spec

    spec = load_spec(None).spec.model_copy(update={"arch": ARCH})
    entries = _entries(1)
    cache = CompileCache(tmp_path / "kcache")
    run = compile_entries(small_tree, entries, spec, jobs=1, timeout_s=240, cache=cache)
    assert run.compiled_now == 1 and run.results[0].status == "ok"
    b = _build_dir(tmp_path, "b", small_tree, entries)
    with _service(CompileCache(tmp_path / "kcache"), jobs=1) as svc:
        r = _ninja(b, svc.env(), jobs=1)
        assert r.returncode == 0, r.stdout + r.stderr
        assert (svc.stats.compiled, svc.stats.cached) == (0, 1)


def test_client_without_service_fails_clearly(small_tree, tmp_path):
    b = _build_dir(tmp_path, "b", small_tree, _entries(1))
    r = _ninja(b, {"MI100_CODEGEN_COMPILE_POOL": str(tmp_path / "gone.sock")})
    assert r.returncode != 0
    assert "compile service" in r.stdout and "is gone" in r.stdout and "Re-run the same mi100-codegen build command" in r.stdout
    assert not list((b / "flash").rglob("*.hsaco"))


def test_requests_the_service_declines():
    base = ["/x/flash.py", "--kernel_name", "k", "-o", "o.hsaco", "-g", "1,1,1", "--target", ARCH,
            "--signature", "i32", "--timeout", "0"]
    req = {"argv": base, "cwd": "/", "env": {"TRITON_F32_DEFAULT": "ieee"}}
    from codegen.compile.service import _Declined

    for bad in ({"argv": base + ["--new-flag"]}, {"argv": [*base[:-1], "2"]}, {"env": {}},
                {"argv": [a if a != ARCH else "gfx942" for a in base]}, {"argv": base}):
        with pytest.raises(_Declined):  # the last one: /x/flash.py does not exist
            parse_request({**req, **bad}, ARCH)


def test_closing_the_service_ends_the_thread_blocked_in_accept():
    """Closing wakes and joins the accepting thread. Left blocked on the socket's fd number, it took
    the connections of a later socket given that number when its call restarted: a loopback HTTP
    server's, in a test run on a loaded machine (the client saw "Connection reset by peer")."""
    class Elsewhere:   # an executor: no local workers to start
        def start(self):
            pass

        def close(self):
            pass

    svc = CompileService(jobs=1, python=None, triton="3.5.1", arch=ARCH, warp_size=64, cache=None,
                         executor=Elsewhere())
    with svc:
        fd, (thread,) = svc._sock.fileno(), svc._threads
        syscall = Path(f"/proc/self/task/{thread.native_id}/syscall")
        if not syscall.is_file():
            pytest.skip("needs Linux's /proc/self/task/TID/syscall to see the thread inside accept")
        deadline = time.monotonic() + 30
        while syscall.read_text().split()[1:2] != [hex(fd)]:   # its call's first argument: the socket
            assert time.monotonic() < deadline, "the service's thread never entered accept"
            time.sleep(0.01)
    assert not thread.is_alive()


SERVE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from codegen.compile.service import CompileService
    from codegen.compile.cache import CompileCache
    from codegen.compile.engine import triton_version

    if __name__ == "__main__":
        svc = CompileService(jobs=1, python=sys.executable, triton=triton_version(), arch="gfx90a",
                             warp_size=64, cache=CompileCache(Path(sys.argv[1])))
        with svc:
            Path(sys.argv[2]).write_text(svc.address)
            while True:
                time.sleep(0.2)
""")


def _start_service(tmp_path: Path, cache: Path) -> tuple[subprocess.Popen, str]:
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    addr_file = tmp_path / f"addr-{time.monotonic_ns()}"
    # its socket folder under tmp_path: a SIGKILLed service cannot remove it
    proc = subprocess.Popen([sys.executable, str(script), str(cache), str(addr_file)],
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    for _ in range(600):
        if addr_file.is_file() and addr_file.read_text():
            return proc, addr_file.read_text()
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the compile service did not start")


def _no_half_written(b: Path, cache: Path, tree: Path, entries: list[KernelEntry]) -> None:
    from codegen.compile.engine import entry_ident

    assert not list(b.rglob("*.mi100-part*"))
    for p in (b / "flash").rglob("*.hsaco"):
        assert p.stat().st_size > 0 and p.with_suffix(".json").is_file()
    c = CompileCache(cache)
    idents = {i.key: i for i in (entry_ident(tree.resolve(), e, 64, triton_version()) for e in entries)}
    for rec in cache.rglob("*.json"):
        assert c.get(idents[rec.stem]) is not None, rec  # every committed record is whole and checks out


def test_killed_service_and_interrupted_ninja_resume(small_tree, tmp_path):
    """SIGKILL of the service mid-run, then SIGINT of ninja mid-run: no half-written image or cache
    entry, and each re-run compiles only what is left."""
    entries = _entries(4)
    b = _build_dir(tmp_path, "b", small_tree, entries)
    cache = tmp_path / "kcache"
    images = [b / e.hsaco for e in entries]

    proc, addr = _start_service(tmp_path, cache)
    ninja = subprocess.Popen([NINJA, "-C", str(b), "-j", "1"], env={**os.environ, "MI100_CODEGEN_COMPILE_POOL": addr},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not any(p.is_file() for p in images) and ninja.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # the service and its workers' parent, mid-build
    proc.wait()
    out = ninja.communicate(timeout=120)[0]
    assert ninja.returncode != 0 and "is gone" in out
    done = sum(p.is_file() for p in images)
    assert 1 <= done < 4
    _no_half_written(b, cache, small_tree, entries)

    proc, addr = _start_service(tmp_path, cache)
    try:
        ninja = subprocess.Popen([NINJA, "-C", str(b), "-j", "1"],
                                 env={**os.environ, "MI100_CODEGEN_COMPILE_POOL": addr},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while sum(p.is_file() for p in images) == done and ninja.poll() is None:
            time.sleep(0.05)
        ninja.send_signal(signal.SIGINT)
        ninja.communicate(timeout=120)
        _no_half_written(b, cache, small_tree, entries)
        before = {p: p.stat().st_mtime_ns for p in images if p.is_file()}
        r = _ninja(b, {"MI100_CODEGEN_COMPILE_POOL": addr}, jobs=1)
        assert r.returncode == 0, r.stdout
        assert all(p.is_file() for p in images)
        assert all(p.stat().st_mtime_ns == t for p, t in before.items())  # finished kernels kept
        _no_half_written(b, cache, small_tree, entries)
    finally:
        proc.kill()
        proc.wait()


needs_dask = pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                                reason="needs Dask distributed (pip install -e '.[dask]'; CI does not install it)")


@pytest.mark.slow
@needs_dask
def test_dask_local_cluster_compiles_through_the_same_cache(small_tree, tmp_path):
    from codegen.compile.dask import DaskExecutor

    entries = _entries(2)
    up = _build_dir(tmp_path, "up", small_tree, entries)
    assert _ninja(up).returncode == 0
    b = _build_dir(tmp_path, "dask", small_tree, entries)
    svc = CompileService(jobs=2, python=sys.executable, triton=triton_version(), arch=ARCH, warp_size=64,
                         cache=CompileCache(tmp_path / "kcache"),
                         executor=DaskExecutor("local", jobs=2, triton=triton_version()))
    with svc:
        r = _ninja(b, svc.env())
        assert r.returncode == 0, r.stdout + r.stderr
        assert (svc.stats.compiled, svc.stats.cached) == (2, 0)
    assert _outputs(up) == _outputs(b)  # same path on the workers (one machine): byte-identical
    assert len(list((tmp_path / "kcache").rglob("*.json"))) == 2


@pytest.mark.slow
@needs_dask
def test_dask_lost_worker_is_recompiled(small_tree, tmp_path):
    from codegen.compile.dask import DaskExecutor

    ex = DaskExecutor("local", jobs=2, triton=triton_version())
    ex.start()
    try:
        pids = ex._client.run(os.getpid)
        task = {"source": str(small_tree / "tritonsrc" / "flash.py"), "kernel_name": "attn_fwd", "signature": FWD_SIG,
                "num_warps": 4, "num_stages": 1, "waves_per_eu": 2, "arch": ARCH, "warp_size": 64}
        futs = [ex.submit(task), ex.submit({**task, "waves_per_eu": 1})]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(ex._client.processing().values()):
            time.sleep(0.05)
        busy = next(w for w, keys in ex._client.processing().items() if keys)
        os.kill(pids[busy], signal.SIGKILL)  # the worker process dies mid-compile
        results = [f.result(timeout=300) for f in futs]
        assert all(r["ok"] for r in results), results
        assert pids[busy] not in ex._client.run(os.getpid).values()  # that worker is really gone
        again = ex.submit(task).result(timeout=300)
        assert again["ok"] and again["hsaco"] == results[0]["hsaco"]
    finally:
        ex.close()


@pytest.mark.slow
def test_build_reports_compiled_and_cached(small_tree, tmp_path, monkeypatch):
    """builder's ninja step with the compile service: kernels_compiled / kernels_cached as
    `build --json` reports them (CMake replaced by the edges file; ninja, the client, the service
    and the compiles are real)."""
    from types import SimpleNamespace

    from codegen.imagebuild import builder
    from codegen.imagebuild.configure import ConfigurePlan
    from rich.console import Console

    entries = _entries(2)
    b = tmp_path / "b"
    (b / "v3src").mkdir(parents=True)
    (b / "v3src" / "Bare.compile").write_text("".join(f"{b / e.hsaco};{e.source};{e.kernel_name}\n" for e in entries))
    tc = Toolchain(cmake=CMAKE, cmake_version="", ninja=NINJA, ninja_version="", cxx="", cc="", hip_dir=None,
                   hip_version=None, python=sys.executable, site_packages=(sysconfig.get_path("purelib"),),
                   triton_version=triton_version())
    venv = prepare_venv(b, tc)
    write_kernel_ninja(b, small_tree, small_tree / "v3python" / "compile.py", venv, entries, cmake=CMAKE)
    (b / "CMakeCache.txt").write_text("")
    monkeypatch.setattr(builder, "run_cmake", lambda *a, **k: 0.0)
    plan = ConfigurePlan(cache=(), knobs=(), files=(), release="0.11b", version=(0, 11, 0))
    spec = SimpleNamespace(arch=ARCH, warp_size=64)

    def build(via: str) -> builder.BuildReport:
        opts = builder.BuildOptions(small_tree, tmp_path / "prefix", b, jobs=2, python=sys.executable,
                                    show_progress=False, compile_via=via, cache_dir=tmp_path / "kcache")
        rep = builder.BuildReport(tree="", release="0.11b", arch=ARCH, spec="", spec_sha256="", prefix="",
                                  build_dir=str(b), log=str(b / builder.LOG_NAME), mode="images")
        builder._configure_and_build(opts, b, plan, tc, rep, Console(quiet=True), spec, builder.open_cache(opts))
        for e in entries:
            assert (b / e.hsaco).stat().st_size > 0
        return rep

    def clean() -> None:
        for e in entries:
            (b / e.hsaco).unlink()
            (b / e.hsaco).with_suffix(".json").unlink()

    first = build("workers")
    assert (first.kernels_compiled, first.kernels_cached, first.compile_via) == (2, 0, "workers")
    assert first.as_json()["compile_service"]["compiled"] == 2
    clean()
    second = build("workers")
    assert (second.kernels_compiled, second.kernels_cached) == (0, 2)
    clean()
    ref = build("upstream")
    assert (ref.kernels_compiled, ref.kernels_cached, ref.compile_service) == (2, 0, None)
    assert ref.as_json()["compile_service"] == {}
