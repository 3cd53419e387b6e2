"""The Machine's child process: imports the pinned emulator from the tree it is given (never in
the parent's process), applies the arch layer, then serves launches one at a time over its
stdin/stdout until stdin closes.

Frames both ways: 8 bytes little-endian length, then a JSON object; a `run` request is followed by
the loaded code image (`image_len` bytes). The answer is `{"execution": {...}}` or
`{"fault": {...}}` (codegen.models.emulate), read by the parent as untrusted input.

Started as `python -P -m codegen.emulate.child ROOT ARCH ARENA_FD ARENA_SIZE DEVICE_BASE WITHOUT CACHE`
(WITHOUT: comma-separated parts of the layer left out, for the tests that show each one matters;
CACHE: the folder of compiled instructions, codegen.emulate.icache, or "" for none)."""

from __future__ import annotations

import json
import os
import struct
import sys
import traceback

FRAME = struct.Struct("<Q")
FRAME_LIMIT = 512 << 20


def read_frame(stream, limit: int = FRAME_LIMIT) -> bytes | None:
    """One frame's JSON bytes; None at the end of the stream (or a frame cut short)."""
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (n,) = FRAME.unpack(head)
    if n > limit:
        raise ValueError(f"a frame of {n} bytes (at most {limit})")
    data = stream.read(n)
    if len(data) < n:
        return None
    return data


def write_frame(stream, obj: dict, payload: bytes = b"") -> None:
    """`obj` as one frame, then `payload` (a request's code image)."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    stream.write(FRAME.pack(len(data)) + data + payload)
    stream.flush()


def main(argv: list[str]) -> int:
    root, arch, fd, size, base = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    without = frozenset(x for x in argv[5].split(",") if x)
    cache = argv[6] or None
    sys.path.insert(0, root)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))   # guard.py walks instruction graphs depth first
    # the pinned emulator's own import (tinygrad, its CPU backend): only in this process
    from codegen.emulate.runner import Runner  # import-time dependency: needs ROOT on sys.path first

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr   # a print anywhere below must not corrupt the frames
    runner = Runner(arch, fd, size, base, without, cache)
    while True:
        raw = read_frame(stdin)
        if raw is None:
            return 0
        req = json.loads(raw)
        if req.get("op") == "run":
            image = stdin.read(int(req["image_len"]))
            try:
                write_frame(stdout, runner.run(req, image))
            except Exception as exc:  # noqa: BLE001 - an emulator failure is a report, not a crash
                traceback.print_exc(file=sys.stderr)
                write_frame(stdout, {"fault": {"kernel": req.get("kernel", ""), "pc": -1, "instruction": "",
                                               "reason": f"emulator: {type(exc).__name__}: {exc}"[:4000]}})
        elif req.get("op") == "opcodes":
            image = stdin.read(int(req["image_len"]))
            write_frame(stdout, runner.opcodes(req, image))
        else:
            write_frame(stdout, {"error": f"unknown request {req.get('op')!r}"})


if __name__ == "__main__":
    os.environ.setdefault("CACHELEVEL", "0")   # tinygrad's pickle cache in ~/.cache: never read
    sys.exit(main(sys.argv[1:]))
