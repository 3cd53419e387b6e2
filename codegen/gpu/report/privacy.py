"""What a report may carry: only what we print on purpose (it is posted publicly).

Scrubbing is by allow-list, not by patterns of what to hide. Every string of the report (a
version, a torch folder, an error message, a kernel name, a key) goes through one function,
`sanitize`, which cuts the text into tokens at whitespace and punctuation and keeps a token only
when it vouches for it:

- a word of our own vocabulary (the words of mi100-codegen's source and specs, plus a few
  names of GPUs and operating systems), alone or with digits (`gfx90a`, `rocm6`, `80GB`);
- a number (at most 15 digits in a row), a version (`2.9.0+rocm6.4`), a hash (7 to 16, 40 or
  64 hex digits);
- a path below `site-packages/` (printed as `<site-packages>/torch/lib/…`), below a known
  system folder (`/opt/rocm/…`, `/usr/lib/…`) or below one of our own relative roots
  (`lib/aotriton.images/…`), every name in it vouched for; any other path is `<path>`, or
  `<path>/NAME` where its last name is vouched for;
- an `https` URL of a known public host whose every name is vouched for.

Anything else becomes `<redacted>` (`<path>`, `<url>`): a user or host name, a folder with a
space in its name, `~/…`, `file://…`, a URL with credentials, the value of an environment
variable not in `KNOWN_ENV` (`HF_TOKEN=<redacted>`), an IP address, a path through `..`, a word
with non-ASCII letters or control characters. As a second net, the machine's own host and user
names (`private_values`) are never vouched for."""

from __future__ import annotations

import functools
import getpass
import os
import re
import socket
import sys
import unicodedata
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from codegen.upstream.releases import IMAGES_DIR

REDACTED, PATH, URL, SITE = "<redacted>", "<path>", "<url>", "<site-packages>"
PLACEHOLDERS = (SITE, REDACTED, PATH, URL)

# environment variables that change what validate sees on a card: a report shows their values
KNOWN_ENV = ("HSA_OVERRIDE_GFX_VERSION", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
             "PYTORCH_ROCM_ARCH", "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "HSA_XNACK", "ROCM_PATH", "ROCM_VERSION",
             "TRITON_F32_DEFAULT")

# names a device, a driver or an OS reports that our own source may not spell
_MACHINE_WORDS = ("instinct radeon vii ubuntu debian fedora rhel centos rocky almalinux opensuse suse leap linux gnu "
                  "lts generic jammy noble focal bookworm trixie bullseye hbm sxm pcie nvl geforce rtx tesla quadro "
                  "microsoft standard wsl azure server desktop redacted").split()

_HOSTS = {"github.com", "raw.githubusercontent.com", "pypi.org", "files.pythonhosted.org", "pytorch.org",
          "download.pytorch.org", "repo.radeon.com", "rocm.docs.amd.com", "docs.amd.com", "huggingface.co"}

# absolute folders that say something about the machine's software and nothing about its owner
_SYSTEM = re.compile(r"/(?:opt/rocm(?:-[0-9.]+)?|usr/(?:lib|lib64|include|share|bin|local/cuda(?:-[0-9.]+)?)|lib|"
                     r"lib64|sys|proc|dev)(?:/|$)")
# the first name of a relative path of our own (a torch folder's, an AOTriton tree's, this package's)
_OWN_ROOTS = {"torch", "lib", "include", "bin", "share", IMAGES_DIR, "v3src", "v3python", "tritonsrc", "rules",
              "tuning", "templates", "aotriton_overlay", "codegen", "triton", "flash", "build", "third_party"}
_PACKAGES = re.compile(r"(?:^|/)(?:site|dist)-packages/")
_ASCII_SEP = set(" \t\n|,;()[]{}<>\"'`=*#!?$&^\\%")
_ATOM_SPLIT = re.compile(r"[._+\-:]")
_CAMEL = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
_RUNS = re.compile(r"[a-z]+|[0-9]+")
_HEX = re.compile(r"[0-9a-f]+")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_NUMERIC = re.compile(r"[0-9.eE+\-]*")
_IPV4 = re.compile(r"[0-9]+(?:\.[0-9]+){3}")  # anywhere in a token: four numbers in a row are never a version of ours
_HEX_COLONS = re.compile(r"[0-9a-f:]+")
_REPEATS = re.compile(re.escape(REDACTED) + r"(?:[ \t]+" + re.escape(REDACTED) + ")+")


@functools.lru_cache(maxsize=1)
def vocabulary() -> frozenset[str]:
    """The words a report may print, lowercase: every word of this package's source and of the
    embedded specs (split at case changes too: `ValidationError` gives `validation`, `error`),
    and `_MACHINE_WORDS`. Built once, from the installed package."""
    words: set[str] = set(_MACHINE_WORDS)
    root = Path(__file__).resolve().parents[2]  # codegen/
    texts = [p for p in sorted(root.rglob("*.py"))]
    for rules in (root / "_data" / "rules", root.parent / "rules"):
        if rules.is_dir():
            texts += sorted(rules.glob("*.yaml"))
            break
    for path in texts:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for word in set(re.findall(r"[A-Za-z]+", text)):
            words.add(word.lower())
            if not word.islower():
                words.update(part.lower() for part in _CAMEL.findall(word))
    return frozenset(words)


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
    """Host and user names, and the folders (home, current, interpreter prefix) a report must not
    show (tests check a written report against them)."""
    paths = {str(Path.home()), os.getcwd(), sys.prefix, sys.base_prefix}
    return sorted({v for v in _names()} | {p for p in paths if p not in ("/", "/usr", "/usr/local")})


@functools.lru_cache(maxsize=1)
def _private_words() -> re.Pattern | None:
    """This machine's host and user names (and their dotted parts) that are not words of ours,
    as one pattern matching any of them between non-alphanumerics (lowercase)."""
    vocab = vocabulary()
    out = set()
    for value in _names():
        for part in {value, *value.split(".")}:
            if len(part) >= 2 and part.lower() not in vocab:
                out.add(part.lower())
    if not out:
        return None
    return re.compile(r"(?<![a-z0-9])(?:" + "|".join(map(re.escape, sorted(out, key=len, reverse=True)))
                      + r")(?![a-z0-9])")


def _atom(a: str, vocab: frozenset[str]) -> bool:
    """One piece of a token between `.`, `_`, `+`, `-`, `:`: a word of ours, a number, a word
    with a number (`gfx90a`, `rocm6`, `80gb`, `0a0`: at most three runs), or a hash."""
    if not a:
        return True
    if not a.isascii() or not a.isalnum():
        return False
    low = a.lower()
    if low in vocab:
        return True
    runs = _RUNS.findall(low)
    if len(runs) <= 3 and all((r in vocab) if r.isalpha() else len(r) <= 15 for r in runs):
        return True
    if _HEX.fullmatch(low) and (7 <= len(low) <= 16 or len(low) in (40, 64)):
        return True
    if a.isalpha() and not a.islower():  # UserWarning: words of ours joined in camel case
        parts = _CAMEL.findall(a)
        if len(parts) <= 4 and "".join(parts) == a and all(len(p) >= 3 and p.lower() in vocab for p in parts):
            return True
    word = re.match(r"[a-z]+", low)  # git1234abc: a word of ours, then a commit
    tail = low[word.end():] if word else ""
    return bool(word and word.group(0) in vocab and 6 <= len(tail) <= 40 and _HEX.fullmatch(tail)
                and any(c.isdigit() for c in tail))


def allowed(token: str) -> bool:
    """Whether a word-like token (no `/`) is one a report may print as it is."""
    if not token:
        return True
    private = _private_words()
    if private is not None and private.search(token.lower()):
        return False
    if _IPV4.search(token):
        return False
    for run in _HEX_COLONS.findall(token.lower()):  # an IPv6 address, anywhere (or a time of day, a MAC address)
        if run.count(":") >= 2 and sum(1 for g in run.split(":") if g) >= 2:
            return False
    vocab = vocabulary()
    return all(_atom(a, vocab) for a in _ATOM_SPLIT.split(token))


def _tail(names: list[str], counts: Counter) -> str:
    """`<path>/NAME` for a path we cannot show whole, NAME its last name when vouched for."""
    counts[PATH] += 1
    name = next((n for n in reversed(names) if n), "")
    return f"{PATH}/{name}" if name not in ("", ".", "..") and not name.startswith("~") and allowed(name) else PATH


def _names_each(rest: str, counts: Counter) -> str:
    """The names of a path below a root we show, each vouched for or `<redacted>`."""
    out = []
    for name in rest.split("/"):
        if name and not allowed(name):
            counts[REDACTED] += 1
            name = REDACTED
        out.append(name)
    return "/".join(out)


def _path(token: str, counts: Counter) -> str:
    names = token.split("/")
    if ".." in names or token.startswith("~") or any(n.startswith("~") for n in names):
        return _tail(names, counts)
    if token.startswith(SITE + "/"):
        return SITE + "/" + _names_each(token[len(SITE) + 1:], counts)
    if token.startswith(PATH + "/"):
        return _tail(names[1:], counts) if len(names) == 2 else _tail([], counts)
    m = _PACKAGES.search(token)
    if m:
        return SITE + "/" + _names_each(token[m.end():], counts)
    if token.startswith("/"):
        if _SYSTEM.match(token) and all(allowed(n) for n in names):
            return token
        return _tail(names, counts)
    if (names[0] in _OWN_ROOTS or all(_NUMERIC.fullmatch(n) for n in names)) and all(allowed(n) for n in names):
        return token  # lib/aotriton.images/amd-gfx908, or numbers: 0.0012/0.01
    return _tail(names, counts)


def _url(token: str, counts: Counter) -> str:
    try:
        u = urlsplit(token)
        host, port = u.hostname, u.port
    except ValueError:
        host = port = None
    if (host is None or u.scheme.lower() not in ("http", "https") or "@" in u.netloc or port is not None
            or host not in _HOSTS or u.query or u.fragment or ".." in u.path.split("/")
            or not all(allowed(n) for n in u.path.split("/"))):
        counts[URL] += 1
        return URL
    return token


def _word(token: str, counts: Counter) -> str:
    if "://" in token:
        return _url(token, counts)
    if "/" in token or token.startswith("~"):
        return _path(token, counts)
    if allowed(token):
        return token
    counts[REDACTED] += 1
    return REDACTED


def _separator(c: str) -> bool:
    if c in _ASCII_SEP:
        return True
    return c >= "\x80" and c.isprintable() and unicodedata.category(c)[0] in "PSZ"


def _units(text: str):
    """("sep", text) and ("tok", text) pieces of `text`, in order; a placeholder a text already
    holds (`<path>/x`, from an earlier pass) stays one token."""
    i, n = 0, len(text)
    while i < n:
        if text[i] == "<":
            ph = next((p for p in PLACEHOLDERS if text.startswith(p, i)), None)
            if ph is not None:
                j = i + len(ph)
                if ph in (SITE, PATH) and j < n and text[j] == "/":
                    while j < n:  # a path, with the placeholders an earlier pass put in it
                        inner = next((p for p in PLACEHOLDERS if text.startswith(p, j)), None)
                        if inner is None and _separator(text[j]):
                            break
                        j += len(inner) if inner else 1
                    yield "tok", text[i:j]
                else:
                    yield "ph", ph
                i = j
                continue
        j = i
        sep = _separator(text[i])
        while j < n and _separator(text[j]) == sep and not (j > i and text[j] == "<"):
            j += 1
        yield ("sep" if sep else "tok"), text[i:j]
        i = j


def sanitize(text: str, counts: Counter | None = None) -> str:
    """`text` with every token we cannot vouch for replaced (module docstring); `counts`, when
    given, gains how many of each placeholder were put in. Idempotent."""
    counts = Counter() if counts is None else counts
    text = text.replace("\r\n", "\n")
    units = list(_units(text))
    out: list[str] = []
    secret_value = False  # after `NAME=` of an environment variable not in KNOWN_ENV: up to the next space
    for i, (kind, piece) in enumerate(units):
        if kind == "sep":
            out.append("".join(c if c.isprintable() or c == "\n" else " " for c in piece))  # a tab too
            if any(c.isspace() for c in piece):
                secret_value = False
            continue
        if kind == "ph":
            out.append(piece)
            continue
        if secret_value:
            counts[REDACTED] += 1
            out.append(REDACTED)
            continue
        nxt = units[i + 1] if i + 1 < len(units) else None
        if (nxt is not None and nxt[0] == "sep" and nxt[1].startswith("=") and _ENV_NAME.fullmatch(piece)
                and piece not in KNOWN_ENV and len(piece) > 1):
            secret_value = not any(c.isspace() for c in nxt[1])
        out.append(_word(piece, counts))
    return _REPEATS.sub(REDACTED, "".join(out))


def scrub(data, counts: Counter | None = None):
    """`data` (dicts, lists, strings, numbers) with every string and every key sanitized; numbers,
    booleans and None kept, anything else sanitized as its `str`."""
    counts = Counter() if counts is None else counts
    if isinstance(data, dict):
        return {scrub(k, counts) if isinstance(k, str) else k: scrub(v, counts) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [scrub(v, counts) for v in data]
    if data is None or isinstance(data, (bool, int, float)):
        return data
    return sanitize(data if isinstance(data, str) else str(data), counts)
