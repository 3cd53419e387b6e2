"""A loopback HTTP server for the owner's command's tests: http.server in a thread of the test
process, bound to 127.0.0.1 on a free port, serving only the files it is given (bytes by URL
path), with HTTP Range, and faults on request: a connection cut after N bytes, the Range header
ignored, a redirect, an HTTP error, a header's value replaced, a body or header that trickles, a body that stalls.
Bounded: a few seconds' socket timeout, a slow answer given up after `slow_s`, shut down when the
test ends."""

from __future__ import annotations

import select
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


@dataclass
class Site:
    files: dict[str, bytes] = field(default_factory=dict)
    cut_after: int | None = None          # close the connection after this many body bytes (once)
    cut_path: str | None = None           # ... only when serving this path (None: any)
    ignore_range: bool = False            # answer 200 with the whole file to a Range request
    no_length: bool = False               # no Content-Length: the body ends when the connection closes
    redirects: dict[str, str] = field(default_factory=dict)   # path -> Location
    errors: dict[str, int] = field(default_factory=dict)      # path -> the HTTP error it answers
    headers: dict[str, str] = field(default_factory=dict)     # header -> the value sent instead of the true one
    trickle: float | None = None          # send the body one byte at a time, this many seconds apart
    stall_after: int | None = None        # send this many body bytes, then nothing (the connection held)
    trickle_head: bool = False            # send the status line, then one header that never ends, trickled
    slow_path: str | None = None          # the slow faults above only when serving this path (None: any)
    slow_s: float = 8.0                   # a slow answer is given up (the connection closed) after this long
    requests: list[tuple[str, str | None]] = field(default_factory=list)   # (path, Range header)
    port: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _handler(site: Site) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 5

        def log_message(self, *args) -> None:   # quiet
            pass

        def send_header(self, keyword: str, value: str) -> None:
            super().send_header(keyword, site.headers.get(keyword, value))

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            rng = self.headers.get("Range")
            site.requests.append((self.path, rng))
            if self.path in site.redirects:
                self.send_response(302)
                self.send_header("Location", site.redirects[self.path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            slow = site.slow_path in (None, self.path)
            if site.trickle_head and slow:
                self._slowly(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000, site.trickle or 0.05)
                return
            data = site.files.get(self.path)
            if data is None or self.path in site.errors:
                self.send_error(site.errors.get(self.path, 404))
                return
            start = 0
            if rng and rng.startswith("bytes=") and not site.ignore_range:
                start = int(rng[6:].split("-")[0])
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            if not site.no_length:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if site.cut_after is not None and site.cut_path in (None, self.path):
                body, site.cut_after = body[:site.cut_after], None
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True
                return
            if slow and site.stall_after is not None:
                self.wfile.write(body[:site.stall_after])
                self.wfile.flush()
                self._slowly(b"", 0)
                return
            if slow and site.trickle is not None:
                self._slowly(body, site.trickle)
                return
            self.wfile.write(body)

        def _slowly(self, data: bytes, gap: float) -> None:
            """`data` one byte every `gap` seconds (nothing: the connection held), for at most
            `site.slow_s`; then the connection closes. A client that left ends it sooner."""
            self.close_connection = True
            end = time.monotonic() + site.slow_s
            for i in range(len(data) if gap else 0):
                if time.monotonic() > end:
                    return
                try:
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(gap)
            while time.monotonic() < end:
                ready, _, _ = select.select([self.connection], [], [], 0.05)
                try:
                    if ready and not self.connection.recv(1 << 16, socket.MSG_PEEK):
                        return   # the client closed its end
                except OSError:
                    return
                if ready:
                    time.sleep(0.05)

    return Handler


@contextmanager
def serve(site: Site) -> Iterator[Site]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(site))
    server.daemon_threads = True
    site.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
