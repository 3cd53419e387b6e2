"""The thin client of `build`'s compile service, run by the build venv's Python in place of the
tree's compiler driver. Standard library only: `build` copies this file into the build venv
(`_mi100_codegen_compile_hook.py`, imported by a `.pth` line at interpreter start) and ninja's
per-kernel command, `cmake -E env … BUILD/venv/bin/python …/compile.py SRC --kernel_name … -o
OUT …`, runs it unchanged.

When the environment names a compile service (MI100_CODEGEN_COMPILE_POOL, set by `build` for the
ninja it runs) and the script is a `compile.py`, the request (the arguments, the working folder,
the compile environment) goes to the service; its answer is written where compile.py would write
it, `OUT.json` (Triton's metadata) then `OUT.hsaco`, each through a temporary file and a rename,
and the process exits before Triton is ever imported. A service that declines a request (an
option it does not handle) lets compile.py run as usual. Without the variable (ninja run by hand,
`build --compile-via upstream`) nothing happens at all. A service that is gone is an error, with
what to do: the build that owned it has stopped.

The same client runs a module of the build after the tree's generator (the build names it when it
installs the client: the module that leaves unreachable kernels out, codegen.imagebuild.reach; this
file, below the build in the layers, names none): when the environment names mi100-codegen's
interpreter (MI100_CODEGEN_REACH, set by `build --kernels dispatched` for CMake's configure) and
this Python runs the tree's generator (`-m v3python.generate`/`aotriton.generate`), `python -m
MODULE BUILD_DIR TREE` runs in that interpreter once the generator has exited without an exception,
before CMake reads its lists; its failure fails the generator's run. The generator itself runs
unchanged.

That run is the one process mi100-codegen starts outside `codegen.core.processes`, the one process
runner: this file runs inside the build venv's interpreter, which cannot import codegen, so it
starts the process with the standard library itself.
"""

import atexit
import contextlib
import os
import sys

POOL_ENV = "MI100_CODEGEN_COMPILE_POOL"
REACH_ENV = "MI100_CODEGEN_REACH"  # its one owner (this file is standard library only)
_FORWARDED_ENV = ("TRITON_F32_DEFAULT",)


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError("the compile service closed the connection")
        buf += chunk
    return bytes(buf)


def _write(path, data):
    tmp = f"{path}.mi100-part{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def request(address, argv, cwd, env):
    """One request to the service: (header dict, image bytes)."""
    # start-up: the .pth imports this module in every run of the build venv's Python; only a
    # compile.py sent to the service needs these
    import json
    import socket
    import struct

    body = json.dumps({"argv": list(argv), "cwd": cwd, "env": env}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(address)
        sock.sendall(struct.pack("!Q", len(body)) + body)
        (n,) = struct.unpack("!Q", _recv_exact(sock, 8))
        header = json.loads(_recv_exact(sock, n))
        (m,) = struct.unpack("!Q", _recv_exact(sock, 8))
        image = _recv_exact(sock, m)
    return header, image


def main(address):
    env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    try:
        header, image = request(address, sys.argv[1:], os.getcwd(), env)
    except OSError as exc:
        sys.stderr.write(
            f"mi100-codegen: the compile service at {address} is gone ({exc}): the build that started it "
            f"has stopped. Re-run the same mi100-codegen build command (it resumes), or run ninja without {POOL_ENV} to "
            f"compile with the tree's own compile.py.\n")
        sys.stderr.flush()
        os._exit(1)
    if header.get("fallback"):
        return  # the tree's compile.py runs as usual
    if not header.get("ok"):
        sys.stderr.write(f"mi100-codegen compile service: {header.get('error', 'compile failed')}\n")
        if header.get("traceback"):
            sys.stderr.write(header["traceback"] + "\n")
        sys.stderr.flush()
        os._exit(1)
    base = os.path.splitext(os.path.join(os.getcwd(), header["out"]))[0]
    _write(base + ".json", header["sidecar"].encode())
    _write(base + ".hsaco", image)
    os._exit(0)


def _generator_build_dir():
    """BUILD_DIR when this interpreter runs a tree's generator (`-m ….generate … --build_dir D`)."""
    argv = list(getattr(sys, "orig_argv", ()))
    if "-m" not in argv:
        return None
    i = argv.index("-m")
    if i + 1 >= len(argv) or argv[i + 1].rsplit(".", 1)[-1] != "generate":
        return None
    rest = argv[i + 2:]
    if "--build_dir" not in rest or rest.index("--build_dir") + 1 >= len(rest):
        return None
    return os.path.abspath(rest[rest.index("--build_dir") + 1])


def _after_generator(python, module, build_dir, failed):
    if failed:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    import subprocess  # start-up: the .pth imports this module in every run of the venv's Python

    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", REACH_ENV)}
    try:
        rc = subprocess.call([python, "-m", module, build_dir, os.getcwd()], env=env)
    except OSError as exc:
        sys.stderr.write(f"mi100-codegen: cannot run {python} to leave out unreachable kernels ({exc}); "
                         f"re-run the same mi100-codegen build command (or pass --kernels all)\n")
        rc = 1
    if rc:
        sys.stderr.flush()
        os._exit(rc)


def _reach_hook(python, module):
    build_dir = _generator_build_dir()
    if build_dir is None:
        return
    failed = []
    previous = sys.excepthook

    def excepthook(*exc):
        failed.append(True)
        previous(*exc)

    sys.excepthook = excepthook
    atexit.register(_after_generator, python, module, build_dir, failed)


def _hook(after_generator=None):
    """Run by the installed copy at interpreter start; `after_generator`: the module to run after
    the tree's generator (None: none)."""
    address = os.environ.get(POOL_ENV)
    if address and len(sys.argv) > 1 and os.path.basename(sys.argv[0]) == "compile.py":
        main(address)
    python = os.environ.get(REACH_ENV)
    if python and after_generator and _generator_build_dir() is not None:
        # the generator's own worker processes (0.13b+ run `-m aotriton.generate` again) inherit
        # the environment: only this, the outermost run, leaves kernels out, once its lists are whole
        del os.environ[REACH_ENV]
        _reach_hook(python, after_generator)

