"""What a report must not carry: host names, user names, and paths outside the packages. One
function, `scrub`, applied to the whole text before it is written; `private_values` lists what it
removes (tests check the written file against it)."""

from __future__ import annotations

import getpass
import os
import re
import socket
import sys
from pathlib import Path

# a path below any site-/dist-packages folder keeps its package-relative part
_PACKAGES = re.compile(r"(?:/[^\s/'\"`|()]+)*/(?:site|dist)-packages/")
_ABS_PATH = re.compile(r"(?<![\w.~<>:/])/(?:[^\s/'\"`|(),]+/)*[^\s/'\"`|(),]*")


def _names() -> dict[str, str]:
    out: dict[str, str] = {}
    for get, label in ((socket.gethostname, "<host>"), (socket.getfqdn, "<host>"), (getpass.getuser, "<user>")):
        try:
            value = get()
        except Exception:  # no user database entry, no resolver: nothing to hide
            continue
        if value and len(value) >= 2 and value not in ("localhost", "root"):
            out[value] = label
    for var in ("USER", "LOGNAME", "HOSTNAME"):
        value = os.environ.get(var)
        if value and len(value) >= 2 and value not in ("localhost", "root"):
            out.setdefault(value, "<user>" if var != "HOSTNAME" else "<host>")
    return out


def private_values() -> list[str]:
    """Host and user names, and the folders (home, current, interpreter prefix) a report hides."""
    paths = {str(Path.home()), os.getcwd(), sys.prefix, sys.base_prefix}
    return sorted({v for v in _names()} | {p for p in paths if p not in ("/", "/usr", "/usr/local")})


def _keep_system(path: str) -> bool:
    """Paths that say something about the machine's software and nothing about its owner."""
    return path.startswith(("/opt/rocm", "/usr/lib", "/usr/local/cuda", "/sys/", "/proc/", "/dev/"))


def scrub(text: str) -> str:
    """`text` with package paths cut to `<site-packages>/…`, other absolute paths (but a few
    system ones) to `<path>/NAME`, and host and user names replaced."""
    text = _PACKAGES.sub("<site-packages>/", text)
    text = _ABS_PATH.sub(lambda m: m.group(0) if _keep_system(m.group(0)) else
                         f"<path>/{m.group(0).rstrip('/').rsplit('/', 1)[-1]}", text)
    for value, label in sorted(_names().items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", label, text)
    return text


__all__ = ["private_values", "scrub"]
