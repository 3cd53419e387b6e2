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
Redirects are followed only to URLs this module would fetch itself (never from HTTPS to HTTP, never
to file://: a redirect our rule refuses is hostile input, exit 2, not a network failure).

Every transfer ends (`Limits`, one owner of the defaults and of their environment overrides): an
overall deadline from the request to the last byte, and a minimum rate, as curl's
`--max-time`, `--speed-limit` and `--speed-time`: fewer than `speed_limit` bytes a second over
`speed_time` seconds, or no byte at all for `speed_time` seconds, ends it. Either is a NetworkError
(exit 3). Bytes are kept as they arrive (one read is one system call), so a download ended by a
deadline, a stall or Ctrl-C resumes from its last byte.

urllib.request and hashlib, no HTTP client of our own (docs/explanation/architecture.md)."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import ipaddress
import os
import re
import socket
import stat
import threading
import time
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

CHUNK = 1 << 20                      # the most one read returns (it returns what one system call got)
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


# --- how long a transfer may take ----------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """How long one transfer of `kind` ('index', 'download') may take: `deadline` seconds in all
    (from the request to its last byte), and at least `speed_limit` bytes a second over every
    `speed_time` seconds (0: no minimum); a read that waits `speed_time` seconds for a byte ends it
    too."""

    kind: str
    deadline: float
    speed_limit: int
    speed_time: float


DEFAULT_LIMITS = {
    "index": Limits("index", deadline=120.0, speed_limit=1024, speed_time=30.0),        # a few MB at most
    "download": Limits("download", deadline=3600.0, speed_limit=1024, speed_time=30.0),  # one bundle
}
LIMITS_ENV = {
    "index_deadline": "MI100_CODEGEN_INDEX_DEADLINE",
    "download_deadline": "MI100_CODEGEN_DOWNLOAD_DEADLINE",
    "speed_limit": "MI100_CODEGEN_SPEED_LIMIT",
    "speed_time": "MI100_CODEGEN_SPEED_TIME",
}
"""The environment variables that override the defaults (seconds; SPEED_LIMIT in bytes a second)."""
_SETTING = re.compile(r"[0-9]{1,9}(\.[0-9]{1,6})?")


def _setting(key: str, default: float, *, zero: bool = False) -> float:
    name = LIMITS_ENV[key]
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = float(raw) if _SETTING.fullmatch(raw) else -1.0
    if value < 0 or (value == 0 and not zero):
        raise UserError(f"${name}={printable(raw[:40])}: not a {'' if zero else 'positive '}number",
                        hint=f"unset it for the default ({default:g})")
    return value


def limits(kind: str) -> Limits:
    """The limits of a transfer of `kind` ('index' or 'download'): `DEFAULT_LIMITS`, each
    overridden by its environment variable (`LIMITS_ENV`)."""
    base = DEFAULT_LIMITS[kind]
    return Limits(kind, _setting(f"{kind}_deadline", base.deadline),
                  int(_setting("speed_limit", base.speed_limit, zero=True)), _setting("speed_time", base.speed_time))


class _Transfer:
    """One transfer under `Limits`: a watchdog that shuts the connection's socket down at the
    deadline (a read blocked on it returns), and the rate over each `speed_time` window."""

    def __init__(self, lim: Limits, step: str, where: str):
        self.lim, self.step, self.where = lim, step, where
        self.start = self.window = time.monotonic()
        self.in_window = 0
        self.expired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(lim.deadline, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def watch(self, sock: socket.socket) -> None:
        """A connection's socket (a duplicate is kept: TLS takes the original over)."""
        with self._lock:
            self._socks.append(sock.dup())
            if self.expired:
                self._socks[-1].shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for s in self._socks:
                s.close()
            self._socks.clear()

    def __enter__(self) -> "_Transfer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def late(self) -> NetworkError | None:
        """The error that ends the transfer when its deadline has passed (else None)."""
        if not self.expired and time.monotonic() - self.start < self.lim.deadline:
            return None
        return NetworkError(self.step, f"{self.where} did not finish within {self.lim.deadline:g} s "
                            f"(${LIMITS_ENV[self.lim.kind + '_deadline']})")

    def got(self, n: int) -> NetworkError | None:
        """`n` more bytes arrived: the error that ends the transfer when it is too slow (else None)."""
        late = self.late()
        if late is not None:
            return late
        now = time.monotonic()
        self.in_window += n
        span = now - self.window
        if span >= self.lim.speed_time:
            if self.in_window < self.lim.speed_limit * span:
                return NetworkError(self.step, f"{self.where} sent {self.in_window:,} bytes in {span:.0f} s, less than "
                                    f"the minimum rate of {self.lim.speed_limit:,} bytes a second "
                                    f"(${LIMITS_ENV['speed_limit']}, ${LIMITS_ENV['speed_time']})")
            self.window, self.in_window = now, 0
        return None

    def stalled(self) -> NetworkError:
        return NetworkError(self.step, f"{self.where} sent nothing for {self.lim.speed_time:g} s "
                            f"(${LIMITS_ENV['speed_time']})")


def _watched(base: type, transfer: _Transfer) -> type:
    """`base` (an http.client connection class) whose sockets `transfer` watches."""

    class Connection(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            create = self._create_connection

            def made(*a, **kw):
                sock = create(*a, **kw)
                transfer.watch(sock)
                return sock

            self._create_connection = made

    return Connection


class _HTTP(urllib.request.HTTPHandler):
    def __init__(self, transfer: _Transfer):
        super().__init__()
        self.transfer = transfer

    def http_open(self, req):
        return self.do_open(_watched(http.client.HTTPConnection, self.transfer), req)


class _HTTPS(urllib.request.HTTPSHandler):
    def __init__(self, transfer: _Transfer):
        super().__init__()
        self.transfer = transfer

    def https_open(self, req):
        return self.do_open(_watched(http.client.HTTPSConnection, self.transfer), req, context=self._context)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL `check_url` accepts: checked before urllib's own rule (which
    refuses file:// as an HTTP error, a network failure to us), its body never read."""

    def http_error_302(self, req, fp, code, msg, headers):
        location = headers.get("location") or headers.get("uri")
        if location is not None:
            check_url(urllib.parse.urljoin(req.full_url, location), what="a redirect to")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        fp.close()   # urllib reads the redirect's body whole otherwise
        return new


def open_url(url: str, transfer: _Transfer, *, offset: int = 0):
    """An HTTP response for `url` (`check_url` first) under `transfer`'s limits, asking for the
    bytes from `offset` on."""
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    opener = urllib.request.build_opener(_HTTP(transfer), _HTTPS(transfer), _Redirects())
    timeout = min(transfer.lim.speed_time, transfer.lim.deadline)
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


def _open_source(want: Wanted, offset: int, transfer: "_Transfer") -> tuple[BinaryIO, int]:
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
    resp = open_url(want.source, transfer, offset=offset)
    if offset and resp.status == 206:
        start = (resp.headers.get("Content-Range") or "").removeprefix("bytes ").split("-")[0]
        if _number(start) == offset:
            return resp, offset
    return resp, 0


class _TooMuch(Exception):
    """The body goes on past the most bytes it may have."""


_NETWORK = (urllib.error.URLError, http.client.HTTPException, OSError)


def _pump(stream: BinaryIO, transfer: _Transfer, sink: Callable[[bytes], None], have: int, most: int) -> int:
    """Every byte of `stream` to `sink` as it arrives (one read, one system call: nothing received
    is held back), never more than `most` in all (_TooMuch), under `transfer`'s limits; the bytes
    held."""
    while True:
        try:
            chunk = stream.read1(CHUNK)
        except _NETWORK as exc:
            raise _ended(transfer, exc) from None
        if not chunk:
            late = transfer.late()
            if late is not None:
                raise late
            return have
        if have + len(chunk) > most:
            raise _TooMuch()
        sink(chunk)
        have += len(chunk)
        slow = transfer.got(len(chunk))
        if slow is not None:
            raise slow


def _ended(transfer: _Transfer, exc: Exception) -> NetworkError:
    """What ended a transfer: its deadline, a read that waited `speed_time` for a byte, or the network."""
    late = transfer.late()
    if late is not None:
        return late
    if isinstance(getattr(exc, "reason", exc), TimeoutError):
        return transfer.stalled()
    return _cannot_reach(transfer.step, transfer.where, exc)


def fetch(want: Wanted, dest: Path, *, step: str, on_bytes: Callable[[int, int], None] = lambda done, total: None,
          lim: Limits | None = None) -> Path:
    """`dest/<name>`, verified (module doc). `step` names the step in messages ('downloading the
    bundle'); `on_bytes(done, total)` is called as bytes arrive (the progress bar); `lim`: the
    transfer's limits (default `limits('download')`)."""
    lim = lim or limits("download")
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
        with _Transfer(lim, step, want.where) as transfer:
            have, h = _receive(want, partial, have, h, transfer, on_bytes)
    if have < want.size:
        raise NetworkError(step, f"{want.where} closed the connection after {have:,} of {want.size:,} bytes",
                           hint=f"{have:,} bytes are kept in {partial}: run the same command again to resume")
    if h.hexdigest() != want.sha256:
        partial.unlink()
        raise UserError(f"{step}: {want.name} from {want.where} has sha256 {h.hexdigest()[:16]}…, the index gives "
                        f"{want.sha256[:16]}…: not the file the index names (deleted, nothing else touched)")
    move_into_place(partial, final)
    return final


def _receive(want: Wanted, partial: Path, have: int, h, transfer: _Transfer,
             on_bytes: Callable[[int, int], None]) -> tuple[int, "hashlib._Hash"]:
    """The rest of the file appended to `partial` (and `h`) as it arrives; the bytes held and their hash."""
    step = transfer.step
    try:
        stream, start = _open_source(want, have, transfer)
    except urllib.error.HTTPError as exc:
        raise NetworkError(step, f"{want.where} answers HTTP {exc.code} ({printable(str(exc.reason))}) for "
                           f"{printable(str(want.source))}", hint="the index names a file its server does not "
                           "serve now: try again later, or --build-locally") from None
    except _NETWORK as exc:
        raise _resumable(_ended(transfer, exc), have, partial) from None
    length = _number(stream.headers.get("Content-Length")) if isinstance(want.source, str) else None
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
        held = [have]

        def keep(chunk: bytes) -> None:
            out.write(chunk)
            out.flush()          # on disk before the next read: an interrupt loses nothing received
            h.update(chunk)
            held[0] += len(chunk)
            on_bytes(held[0], want.size)

        try:
            have = _pump(stream, transfer, keep, have, want.size)
        except _TooMuch:
            out.close()
            partial.unlink()
            raise UserError(f"{step}: {want.where} sends more than the {want.size:,} bytes the index "
                            f"gives for {want.name}; not the file the index names (deleted)") from None
        except NetworkError as exc:
            raise _resumable(exc, held[0], partial) from None
    return have, h


def fetch_bytes(url: str, *, limit: int, step: str, lim: Limits | None = None) -> bytes:
    """The body of `url` (`check_url`), at most `limit` bytes (more: UserError), for a small
    document such as an index, under `lim` (default `limits('index')`); a network failure, the
    deadline or a too slow server is a NetworkError naming `step`."""
    where = urllib.parse.urlsplit(url).netloc
    data = bytearray()
    with _Transfer(lim or limits("index"), step, where) as transfer:
        try:
            with open_url(url, transfer) as resp:
                declared = _number(resp.headers.get("Content-Length"))
                _pump(resp, transfer, data.extend, 0, limit)
        except urllib.error.HTTPError as exc:
            raise NetworkError(step, f"{where} answers HTTP {exc.code} ({printable(str(exc.reason))}) for "
                               f"{printable(url)}") from None
        except _NETWORK as exc:
            raise _ended(transfer, exc) from None
        except _TooMuch:
            raise UserError(f"{step}: {printable(url)} is larger than {limit:,} bytes; refusing to read it") from None
    if declared is not None and len(data) < declared:
        raise NetworkError(step, f"{where} closed the connection after {len(data):,} of {declared:,} bytes",
                           hint="run the same command again")
    return bytes(data)


def _cannot_reach(step: str, where: str, exc: Exception, hint: str | None = None) -> NetworkError:
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
    return NetworkError(step, f"cannot reach {where} ({printable(str(reason))}): this step needs the network", hint=hint)


def _resumable(exc: NetworkError, have: int, partial: Path) -> NetworkError:
    """`exc` with the hint of a download that resumes (the bytes kept, where)."""
    kept = f"{have:,} bytes are kept in {partial}: " if have else ""
    exc.hint = f"{kept}run the same command again (it resumes), or use an index folder: --index DIR"
    return exc
