"""Fetching one file an index names: from HTTPS (or plain HTTP to this machine's loopback address,
which the tests serve), or from a folder; resumable, with progress, bounded by the size the index
gives and checked against its sha256 before anyone opens the file.

The file is written to `<dest>/<name>.<sha256 prefix>.partial` while it comes, then renamed to
`<dest>/<name>` once its size and sha256 are the index's: a name without `.partial` was verified
when it was written, and is verified again before it is used. An
interrupted download (Ctrl-C, a dropped connection) keeps the partial file; the next run hashes
what it holds and asks the server for the rest (HTTP Range), or starts over when the server
ignores the range. A server that sends more than the index's size, or a file whose sha256 is not
the index's, is hostile input: the partial file is deleted and one message says so (exit 2).
Redirects are followed only to URLs this module would fetch itself (never from HTTPS to HTTP).

urllib.request and hashlib, no HTTP client of our own (docs/explanation/architecture.md)."""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import os
import re
import stat
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from codegen import __version__
from codegen.core.errors import EnvironmentMissing, UserError
from codegen.core.fsutil import move_into_place
from codegen.core.ui import printable

CHUNK = 1 << 20
TIMEOUT_S = 30.0                     # seconds without a byte before a connection counts as dropped
USER_AGENT = f"mi100-codegen/{__version__}"


class NetworkError(EnvironmentMissing):
    """A step that needs the network could not reach it, or its server would not serve it (an
    HTTP error): exit 3; `step` names the step."""

    def __init__(self, step: str, why: str, hint: str | None = None):
        super().__init__(f"{step}: {why}", hint=hint)
        self.step = step


LOOPBACK_HOSTS = ("localhost",)


def loopback(host: str | None) -> bool:
    """`host` names this machine: a loopback address (127.0.0.1, ::1) or `localhost`."""
    if host is None:
        return False
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str, *, what: str = "URL", hint: str | None = None) -> str:
    """`url` when it is one we fetch (the one rule: the index's location, what it names, each
    redirect): https:// with a host, or http:// to this machine (`loopback`: a server the tests
    run); no user or password, a valid port, no space or control character. Anything else is a
    UserError (with `hint`)."""
    shown = printable(url[:200])
    if not url.isprintable() or any(c.isspace() for c in url):
        raise UserError(f"{what} {shown}: a URL holds no space or control character", hint=hint)
    try:
        parts = urllib.parse.urlsplit(url)
        host, _port = parts.hostname, parts.port
    except ValueError:
        raise UserError(f"{what} {shown}: not a URL (or not a valid port)", hint=hint) from None
    if "@" in parts.netloc:
        raise UserError(f"{what} {shown}: a URL with a user or password is never fetched", hint=hint)
    if parts.scheme == "https" and host:
        return url
    if parts.scheme == "http" and loopback(host):
        return url
    raise UserError(f"{what} {shown}: only https:// URLs are fetched (plain http:// only from "
                    "this machine's loopback address)", hint=hint)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL `check_url` accepts."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check_url(urllib.parse.urljoin(req.full_url, newurl), what="a redirect to")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def open_url(url: str, *, offset: int = 0, timeout: float = TIMEOUT_S):
    """An HTTP response for `url` (`check_url` first), asking for the bytes from `offset` on."""
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    opener = urllib.request.build_opener(_Redirects())
    return opener.open(urllib.request.Request(check_url(url), headers=headers), timeout=timeout)


@dataclass(frozen=True)
class Wanted:
    """One file as the index names it: where it is (an https URL, or a file of an index folder,
    already resolved inside it), its file name here, its size and sha256."""

    source: str | Path
    name: str
    size: int
    sha256: str

    @property
    def where(self) -> str:
        return str(self.source) if isinstance(self.source, Path) else urllib.parse.urlsplit(self.source).netloc


def _regular(path: Path) -> bool:
    """`path` is a regular file (not a link); a link or anything else there is removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode):
        return True
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path}: a folder where the download goes; remove it")
    path.unlink()
    return False


def _hash_file(path: Path, limit: int) -> tuple["hashlib._Hash", int]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while n <= limit:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    return h, n


def _verified(path: Path, want: Wanted) -> bool:
    h, n = _hash_file(path, want.size)
    return n == want.size and h.hexdigest() == want.sha256


_NUMBER = re.compile(r"[0-9]{1,19}")


def _number(header: str | None) -> int | None:
    """A byte count or offset a server's header gives, or None: 1-19 ASCII digits (str.isdigit
    takes '²', which int refuses, and int refuses more than 4,300 digits)."""
    return int(header) if header is not None and _NUMBER.fullmatch(header) else None


def _open_source(want: Wanted, offset: int, timeout: float) -> tuple[BinaryIO, int]:
    """A stream of the file from `offset` (or from 0, when the server ignores the range) and where
    it starts."""
    if isinstance(want.source, Path):
        try:   # never waits on a FIFO
            fd = os.open(want.source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise UserError(f"{want.source}: cannot read the bundle the index names ({exc.strerror or exc})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UserError(f"{want.source}: the index names something that is not a regular file")
        f = os.fdopen(fd, "rb")
        f.seek(offset)
        return f, offset
    resp = open_url(want.source, offset=offset, timeout=timeout)
    if offset and resp.status == 206:
        start = (resp.headers.get("Content-Range") or "").removeprefix("bytes ").split("-")[0]
        if _number(start) == offset:
            return resp, offset
    return resp, 0


def fetch(want: Wanted, dest: Path, *, step: str, on_bytes: Callable[[int, int], None] = lambda done, total: None,
          timeout: float = TIMEOUT_S) -> Path:
    """`dest/<name>`, verified (module doc). `step` names the step in messages ('downloading the
    bundle'); `on_bytes(done, total)` is called as bytes arrive (the progress bar)."""
    dest.mkdir(parents=True, exist_ok=True)
    final, partial = dest / want.name, dest / f"{want.name}.{want.sha256[:16]}.partial"
    if _regular(final):
        if _verified(final, want):
            on_bytes(want.size, want.size)
            return final
        final.unlink()   # not the file the index names now (a newer index, or damaged): fetched again
    have, h = 0, hashlib.sha256()
    if _regular(partial):
        h, have = _hash_file(partial, want.size)
        if have > want.size:
            partial.unlink()
            have, h = 0, hashlib.sha256()
    on_bytes(have, want.size)
    if have < want.size:
        try:
            stream, start = _open_source(want, have, timeout)
        except urllib.error.HTTPError as exc:
            raise NetworkError(step, f"{want.where} answers HTTP {exc.code} ({printable(str(exc.reason))}) for "
                               f"{printable(str(want.source))}", hint="the index names a file its server does not "
                               "serve now: try again later, or --build-locally") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            raise _offline(step, want, exc, have, partial) from None
        length = _number(stream.headers.get("Content-Length")) if not isinstance(want.source, Path) else None
        if length is not None and start + length != want.size:
            stream.close()
            partial.unlink(missing_ok=True)
            raise UserError(f"{step}: {want.where} serves {want.name} as {start + length:,} bytes, the index "
                            f"gives {want.size:,}: not the file the index names (nothing kept)")
        with stream, open(partial, "r+b" if start else "wb") as out:
            if start == 0 and have:
                h, have = hashlib.sha256(), 0   # the server sends the whole file: start over
            out.seek(have)
            out.truncate()
            have = _copy(stream, out, h, have, want, step, partial, on_bytes)
    if have < want.size:
        raise NetworkError(step, f"{want.where} closed the connection after {have:,} of {want.size:,} bytes",
                           hint=f"{have:,} bytes are kept in {partial}: run the same command again to resume")
    if h.hexdigest() != want.sha256:
        partial.unlink()
        raise UserError(f"{step}: {want.name} from {want.where} has sha256 {h.hexdigest()[:16]}…, the index gives "
                        f"{want.sha256[:16]}…: not the file the index names (deleted, nothing else touched)")
    move_into_place(partial, final)
    return final


def _copy(stream: BinaryIO, out: BinaryIO, h, have: int, want: Wanted, step: str, partial: Path,
          on_bytes: Callable[[int, int], None]) -> int:
    """The rest of the stream appended to `out` and `h`, never past the index's size; the bytes held."""
    while True:
        try:
            chunk = stream.read(CHUNK)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            out.flush()
            raise _offline(step, want, exc, have, partial) from None
        if not chunk:
            return have
        if have + len(chunk) > want.size:
            out.close()
            partial.unlink()
            raise UserError(f"{step}: {want.where} sends more than the {want.size:,} bytes the index "
                            f"gives for {want.name}; not the file the index names (deleted)")
        out.write(chunk)
        h.update(chunk)
        have += len(chunk)
        on_bytes(have, want.size)


def fetch_bytes(url: str, *, limit: int, step: str, timeout: float = TIMEOUT_S) -> bytes:
    """The body of `url` (`check_url`), at most `limit` bytes (more: UserError), for a small
    document such as an index; a network failure is a NetworkError naming `step`."""
    where = urllib.parse.urlsplit(url).netloc
    try:
        with open_url(url, timeout=timeout) as resp:
            data = resp.read(limit + 1)
            declared = _number(resp.headers.get("Content-Length"))
    except urllib.error.HTTPError as exc:
        raise NetworkError(step, f"{where} answers HTTP {exc.code} ({printable(str(exc.reason))}) for "
                           f"{printable(url)}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        raise _cannot_reach(step, where, exc) from None
    if len(data) > limit:
        raise UserError(f"{step}: {printable(url)} is larger than {limit:,} bytes; refusing to read it")
    if declared is not None and len(data) < declared:
        raise NetworkError(step, f"{where} closed the connection after {len(data):,} of {declared:,} bytes",
                           hint="run the same command again")
    return data


def _cannot_reach(step: str, where: str, exc: Exception, hint: str | None = None) -> NetworkError:
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
    return NetworkError(step, f"cannot reach {where} ({printable(str(reason))}): this step needs the network", hint=hint)


def _offline(step: str, want: Wanted, exc: Exception, have: int, partial: Path) -> NetworkError:
    kept = f"{have:,} bytes are kept in {partial}: " if have else ""
    return _cannot_reach(step, want.where, exc, hint=f"{kept}run the same command again when online (it resumes), "
                         "or use an index folder: --index DIR")


__all__ = ["LOOPBACK_HOSTS", "NetworkError", "Wanted", "check_url", "fetch", "fetch_bytes", "loopback", "open_url"]
