"""The compile service's workers on a Dask cluster (`build --dask ADDRESS|local`; the optional
`[dask]` extra). Each kernel is one Dask task that compiles it the way the local warm workers do
(codegen.compile.worker.compile_kernel), in a Dask worker process that keeps Triton and the
kernel modules imported between tasks. Results come back to the service, which writes them to the
kernel cache and answers ninja's edge, exactly as for local workers.

- `local`: a `LocalCluster` of `--jobs` single-threaded worker processes, in this interpreter
  (it must hold the spec's Triton: a development venv with `[upstream,dask]`).
- an address (`tcp://scheduler:8786`): an existing cluster. Its workers need mi100-codegen and the
  spec's Triton (the same version: checked per task, a mismatch fails the kernel with a message).
  The kernel sources travel with the tasks (sent once per source set to every worker,
  `Client.scatter(broadcast=True)`, again when the workers holding them are gone): a
  worker whose filesystem has the tree at the same path compiles from there, else from a copy in
  its temporary folder (then the code objects' DWARF line tables name that folder: only the
  debug sections differ, see docs/build.md).
- A lost worker: Dask runs its tasks again elsewhere (`distributed.scheduler.allowed-failures`);
  a task that still fails comes back as a crash, and the service compiles it once more.
"""

from __future__ import annotations

import contextlib
import concurrent.futures
import hashlib
import logging
import os
import sys
import tempfile
import time
import traceback
import uuid
from functools import lru_cache
from pathlib import Path

from packaging.version import InvalidVersion, Version

from codegen.core.errors import EnvironmentMissing, UpstreamError
from codegen.core.fsutil import move_into_place
from codegen.compile.cache import _closure, _defines
from codegen.compile import worker
from codegen.compile.resources import parse_resources
from codegen.compile.worker import compile_kernel, first_error_line

_ACTIVE: dict[str, str] = {}  # in a Dask worker: "folder" -> the sources folder its kernel modules come from


def _public(version: str | None) -> str | None:
    try:
        return Version(version).public if version else version
    except InvalidVersion:
        return version


def _materialize(files: dict[str, bytes], digest: str) -> Path:
    root = Path(tempfile.gettempdir()) / f"mi100-codegen-src-{digest[:24]}"
    if not root.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix=".mi100-src-", dir=tempfile.gettempdir()))
        for rel, data in files.items():
            dest = (tmp / rel).resolve()
            if tmp.resolve() not in dest.parents:
                raise ValueError(f"source {rel!r} escapes its folder")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        with contextlib.suppress(OSError):  # another task of this worker got there first
            move_into_place(tmp, root)
    return root


def _switch_modules(folder: str) -> None:
    """A long-lived worker may compile several trees whose kernel modules share names (`flash`):
    forget the modules imported from the previous folder before importing from another."""
    old = _ACTIVE.get("folder")
    if old is not None:
        for name, mod in list(sys.modules.items()):
            f = getattr(mod, "__file__", None)
            if f and Path(f).parent.as_posix() == old:
                del sys.modules[name]
        while old in sys.path:
            sys.path.remove(old)
    worker._MODULES.clear()
    _ACTIVE["folder"] = folder


def compile_remote(task: dict, triton_version: str, files: dict[str, bytes] | None = None) -> dict:
    """One kernel, in a Dask worker: the fields of a pool result (`hsaco`, `sidecar`, `resources`)."""
    os.environ["TRITON_F32_DEFAULT"] = "ieee"
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="mi100-codegen-triton-"))
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True
    t0 = time.perf_counter()
    try:
        # import-time dependency: the spec's Triton is the Dask worker's, never the client's
        import triton

        if _public(getattr(triton, "__version__", None)) != _public(triton_version):
            return {"ok": False, "compile_s": 0.0, "error": f"the Dask worker on {os.uname().nodename} has Triton "
                    f"{triton.__version__}, the build compiles with {triton_version}"}
        source = task["source"]
        if files is not None and not (Path(source).is_file()
                                      and all((Path(source).parent / rel).is_file()
                                              and (Path(source).parent / rel).read_bytes() == data
                                              for rel, data in files.items())):
            source = str(_materialize(files, task["sources_digest"]) / Path(source).name)
        folder = Path(source).parent.as_posix()
        if _ACTIVE.get("folder") != folder:
            _switch_modules(folder)
        raw = compile_kernel({**task, "source": source})
        res = parse_resources(raw["amdgcn"], raw["hsaco"], raw["shared"], raw["llir"])
        return {"ok": True, "compile_s": time.perf_counter() - t0, "hsaco": raw["hsaco"],
                "sidecar": raw["sidecar"], "resources": res.model_dump()}
    except Exception as exc:  # noqa: BLE001 - every compile failure is a result
        return {"ok": False, "compile_s": time.perf_counter() - t0, "error": first_error_line(exc),
                "traceback": "".join(traceback.format_exception(exc))[-4000:]}


@lru_cache(maxsize=64)
def _closure_files(source: str, kernel_name: str) -> tuple[str, dict[str, bytes]]:
    files = _closure(Path(source))
    home = next((p for p, tree in files.values() if _defines(tree, kernel_name)), None)
    if home is not None and home != Path(source):
        files = {**files, **_closure(home)}
    root = Path(source).parent
    out = {p.relative_to(root).as_posix(): p.read_bytes() for p, _ in files.values() if root in p.parents}
    digest = hashlib.sha256(b"".join(k.encode() + b"\0" + hashlib.sha256(v).digest()
                                     for k, v in sorted(out.items()))).hexdigest()
    return digest, out


class DaskExecutor:
    """`start()`, `submit(task) -> concurrent.futures.Future` (a pool result dict), `close()`."""

    def __init__(self, address: str, *, jobs: int, python: str | None = None, triton: str | None = None):
        self.address, self.jobs, self.triton = address, max(1, int(jobs)), triton or ""
        self.python = python
        self._client = None
        self._cluster = None
        self._scattered: dict[str, object] = {}
        self._running: dict[str, object] = {}  # Dask forgets a task whose future nobody holds

    def start(self) -> None:
        try:
            # import-time dependency: Dask is the optional [dask] extra
            from distributed import Client, LocalCluster
        except ImportError:
            raise EnvironmentMissing("--dask needs Dask distributed in mi100-codegen's environment",
                                     hint="pip install 'mi100-codegen[dask]'") from None
        try:
            if self.address == "local":
                self._cluster = LocalCluster(n_workers=self.jobs, threads_per_worker=1, processes=True,
                                             dashboard_address=None, silence_logs=logging.ERROR)
                self._client = Client(self._cluster)
            else:
                self._client = Client(self.address, timeout="30s")
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot reach the Dask scheduler at {self.address}: {exc}") from None

    def submit(self, task: dict) -> concurrent.futures.Future:
        out: concurrent.futures.Future = concurrent.futures.Future()
        digest, files = _closure_files(task["source"], task["kernel_name"])
        held = self._scattered.get(digest)
        if held is None or held.status != "finished":  # new, or lost with the workers that held it
            # on every worker: a lost worker does not take the only copy (its tasks would be cancelled)
            self._scattered[digest] = self._client.scatter([files], hash=False, broadcast=True)[0]
        key = f"mi100-kernel-{uuid.uuid4().hex}"
        fut = self._client.submit(compile_remote, {**task, "sources_digest": digest}, self.triton,
                                  self._scattered[digest], pure=False, key=key)
        self._running[key] = fut

        def done(f) -> None:
            self._running.pop(key, None)
            try:
                out.set_result(f.result())
            except BaseException as exc:  # noqa: BLE001 - a lost worker, a killed task
                out.set_result({"ok": False, "crashed": True, "compile_s": 0.0,
                                "error": f"the Dask task failed: {type(exc).__name__}: {exc}"})

        fut.add_done_callback(done)
        return out

    def close(self) -> None:
        for obj in (self._client, self._cluster):
            if obj is not None:
                with contextlib.suppress(Exception):  # noqa: BLE001 - closing what is already gone
                    obj.close()
        self._client = self._cluster = None
