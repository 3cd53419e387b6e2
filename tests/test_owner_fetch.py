"""Fetching what an index names (codegen.ship.fetch) from a loopback HTTP server (tests/loopback.py):
verified by size and sha256 before anyone opens it, a download cut midway and resumed with an HTTP
Range, a server that ignores the range, a size or sha256 that lies, an unreachable server, the
URL rule (https, plain http only to this machine, redirects under the same rule: file:// too), and
the limits every transfer ends by (a deadline, a minimum rate; made small here, so that each case
ends in a second or two), with every byte received kept for the resume."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from codegen.core.errors import EXIT_UPSTREAM, EXIT_USER, UserError
from codegen.ship.fetch import (DEFAULT_LIMITS, LIMITS_ENV, Limits, NetworkError, Wanted, check_url, fetch, fetch_bytes,
                                limits)
from loopback import Site, serve

REPO = Path(__file__).resolve().parents[1]
DATA = os.urandom(3 * (1 << 20) + 12345)   # a few chunks' worth
SHA = hashlib.sha256(DATA).hexdigest()


def want(site: Site, size: int = len(DATA), sha: str = SHA, path: str = "/b/x.mi100-bundle.zip") -> Wanted:
    return Wanted(site.url(path), "x.mi100-bundle.zip", size, sha)


def test_download_is_verified_and_reused(tmp_path):
    with serve(Site({"/b/x.mi100-bundle.zip": DATA})) as site:
        seen = []
        got = fetch(want(site), tmp_path, step="downloading x", on_bytes=lambda d, t: seen.append((d, t)))
        assert got.read_bytes() == DATA and seen[-1] == (len(DATA), len(DATA))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["x.mi100-bundle.zip"]   # no partial left
        n = len(site.requests)
        assert fetch(want(site), tmp_path, step="downloading x") == got and len(site.requests) == n   # not fetched again


def test_a_download_cut_midway_resumes_with_a_range(tmp_path):
    half = len(DATA) // 2
    with serve(Site({"/b/x.mi100-bundle.zip": DATA}, cut_after=half)) as site:
        with pytest.raises(NetworkError) as exc:
            fetch(want(site), tmp_path, step="downloading x")
        assert exc.value.exit_code == EXIT_UPSTREAM
        assert f"closed the connection after {half:,} of {len(DATA):,} bytes" in str(exc.value)
        assert "run the same command again to resume" in exc.value.hint
        partial = next(tmp_path.glob("*.partial"))
        assert partial.stat().st_size == half and not (tmp_path / "x.mi100-bundle.zip").exists()
        got = fetch(want(site), tmp_path, step="downloading x")
        assert site.requests[-1] == ("/b/x.mi100-bundle.zip", f"bytes={half}-")
        assert got.read_bytes() == DATA and not partial.exists()


def test_a_server_that_ignores_the_range_starts_over(tmp_path):
    with serve(Site({"/b/x.mi100-bundle.zip": DATA}, cut_after=1000)) as site:
        with pytest.raises(NetworkError):
            fetch(want(site), tmp_path, step="downloading x")
        site.ignore_range = True
        assert fetch(want(site), tmp_path, step="downloading x").read_bytes() == DATA


@pytest.mark.parametrize("lie", ["size", "sha256", "longer"])
def test_an_index_that_lies_is_one_message_and_nothing_kept(tmp_path, lie):
    with serve(Site({"/b/x.mi100-bundle.zip": DATA})) as site:
        w = {"size": want(site, size=len(DATA) - 1), "sha256": want(site, sha="0" * 64),
             "longer": want(site, size=len(DATA) + 10)}[lie]
        with pytest.raises(UserError) as exc:
            fetch(w, tmp_path, step="downloading x")
        assert exc.value.exit_code == EXIT_USER
        words = {"size": "serves x.mi100-bundle.zip as 3,158,073 bytes, the index gives 3,158,072",
                 "sha256": "the index gives 0000000000000000…: not the file the index names",
                 "longer": "serves x.mi100-bundle.zip as 3,158,073 bytes, the index gives 3,158,083"}[lie]
        assert words in str(exc.value)
        assert list(tmp_path.iterdir()) == []


def test_a_server_without_a_length_is_read_no_further_than_the_index_says(tmp_path):
    with serve(Site({"/b/x.mi100-bundle.zip": DATA}, no_length=True)) as site:
        with pytest.raises(UserError, match="sends more than the 3,158,072 bytes the index gives"):
            fetch(want(site, size=len(DATA) - 1), tmp_path, step="downloading x")
        assert list(tmp_path.iterdir()) == []
        assert fetch(want(site), tmp_path, step="downloading x").read_bytes() == DATA


def test_a_damaged_file_in_the_cache_is_fetched_again(tmp_path):
    (tmp_path / "x.mi100-bundle.zip").write_bytes(DATA[:-1] + b"!")
    with serve(Site({"/b/x.mi100-bundle.zip": DATA})) as site:
        assert fetch(want(site), tmp_path, step="downloading x").read_bytes() == DATA


def test_an_unreachable_server_names_the_step(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    w = Wanted(f"http://127.0.0.1:{port}/x.mi100-bundle.zip", "x.mi100-bundle.zip", 10, SHA)
    with pytest.raises(NetworkError, match=r"^downloading x: cannot reach 127.0.0.1:\d+ .*this step needs the network"):
        fetch(w, tmp_path, step="downloading x")
    with pytest.raises(NetworkError, match="reading the index: cannot reach"):
        fetch_bytes(w.source, limit=100, step="reading the index")
    with serve(Site({"/i.json": b"{}" * 100})) as site:
        with pytest.raises(NetworkError, match="answers HTTP 404"):
            fetch_bytes(site.url("/none.json"), limit=1000, step="reading the index")
        with pytest.raises(UserError, match="larger than 10 bytes"):
            fetch_bytes(site.url("/i.json"), limit=10, step="reading the index")
        site.cut_after = 50
        with pytest.raises(NetworkError, match="closed the connection after 50 of 200 bytes"):
            fetch_bytes(site.url("/i.json"), limit=1000, step="reading the index")


@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000, "-1", ""])
def test_a_servers_byte_counts_that_are_no_numbers_are_ignored(tmp_path, value):
    """Content-Length and Content-Range come from the server: '²' (str.isdigit says yes, int says
    no) or more digits than int reads are no number; the index's size still bounds the body."""
    with serve(Site({"/b/x.mi100-bundle.zip": DATA, "/i.json": b"{}"},
                    headers={"Content-Length": value, "Content-Range": f"bytes {value}-1/2"})) as site:
        assert fetch(want(site), tmp_path, step="downloading x").read_bytes() == DATA
        assert fetch_bytes(site.url("/i.json"), limit=1000, step="reading the index") == b"{}"
        partial = tmp_path / "again" / f"x.mi100-bundle.zip.{SHA[:16]}.partial"
        partial.parent.mkdir()
        partial.write_bytes(DATA[:100])
        # its range is no number: taken for the whole file, which then ends 100 bytes short
        with pytest.raises(NetworkError, match="closed the connection after 3,157,973 of 3,158,073 bytes"):
            fetch(want(site), tmp_path / "again", step="downloading x")


def test_only_https_or_loopback_http_and_redirects_under_the_same_rule(tmp_path):
    for ok in ("https://example.org/i.json", "http://127.0.0.1:8000/i.json", "http://[::1]/i.json"):
        assert check_url(ok) == ok
    for bad in ("http://example.org/i.json", "file:///etc/passwd", "ftp://example.org/x", "https:///x",
                "http://127.0.0.1.example.org/x"):
        with pytest.raises(UserError, match="only https:// URLs are fetched"):
            check_url(bad)
    for bad, words in (("https://user:pw@example.org/i.json", "a user or password"),
                       ("https://example.org:99999/i.json", "not a valid port"),
                       ("https://example.org/\x1b[2Ji.json", "no space or control character"),
                       ("https://example.org/a b.json", "no space or control character")):
        with pytest.raises(UserError, match=words):   # the one rule: the index's location and redirects too
            check_url(bad)
    with serve(Site({"/b/x.mi100-bundle.zip": DATA},
                    redirects={"/away": "http://example.org/x", "/here": "/b/x.mi100-bundle.zip"})) as site:
        with pytest.raises(UserError, match="a redirect to http://example.org/x: only https://"):
            fetch(want(site, path="/away"), tmp_path, step="downloading x")
        assert fetch(want(site, path="/here"), tmp_path, step="downloading x").read_bytes() == DATA


def test_a_file_of_an_index_folder(tmp_path):
    src = tmp_path / "index" / "x.mi100-bundle.zip"
    src.parent.mkdir()
    src.write_bytes(DATA)
    got = fetch(Wanted(src, src.name, len(DATA), SHA), tmp_path / "cache", step="copying x")
    assert got.read_bytes() == DATA and got.parent == tmp_path / "cache"
    with pytest.raises(UserError, match="not the file the index names"):
        fetch(Wanted(src, "y.mi100-bundle.zip", len(DATA), "1" * 64), tmp_path / "cache", step="copying x")
    assert not (tmp_path / "cache" / "y.mi100-bundle.zip").exists()
    fifo = tmp_path / "index" / "f.mi100-bundle.zip"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        fetch(Wanted(Path(fifo), "f.mi100-bundle.zip", 1, SHA), tmp_path / "cache", step="copying f")


def test_a_redirect_to_file_is_our_rule_not_a_network_failure(tmp_path):
    """urllib refuses file:// itself, as an HTTP error (exit 3, "try again later"); our rule runs first."""
    with serve(Site({"/i.json": b"{}"}, redirects={"/away": "file:///etc/passwd", "/i": "file:///etc/passwd"})) as site:
        with pytest.raises(UserError, match="a redirect to file:///etc/passwd: only https:// URLs are fetched") as exc:
            fetch(want(site, path="/away"), tmp_path, step="downloading x")
        assert exc.value.exit_code == EXIT_USER and not isinstance(exc.value, NetworkError)
        with pytest.raises(UserError, match="a redirect to file:///etc/passwd: only https:// URLs are fetched"):
            fetch_bytes(site.url("/i"), limit=100, step="reading the index")


def test_the_limits_have_one_owner_and_the_environment_overrides_them(monkeypatch):
    for name in LIMITS_ENV.values():
        monkeypatch.delenv(name, raising=False)
    assert limits("download") == DEFAULT_LIMITS["download"] and limits("index") == DEFAULT_LIMITS["index"]
    monkeypatch.setenv(LIMITS_ENV["download_deadline"], "2.5")
    monkeypatch.setenv(LIMITS_ENV["speed_limit"], "0")
    assert limits("download") == Limits("download", 2.5, 0, DEFAULT_LIMITS["download"].speed_time)
    assert limits("index").deadline == DEFAULT_LIMITS["index"].deadline
    for bad in ("0", "-1", "1e9", "soon", "\x1b[2J"):
        monkeypatch.setenv(LIMITS_ENV["speed_time"], bad)
        with pytest.raises(UserError, match=r"\$MI100_CODEGEN_SPEED_TIME=.*: not a positive number"):
            limits("download")


def test_the_bundles_page_states_the_limits_and_their_overrides():
    text = " ".join((REPO / "docs" / "bundles.md").read_text(encoding="utf-8").split())
    index, download = DEFAULT_LIMITS["index"], DEFAULT_LIMITS["download"]
    assert (index.speed_limit, index.speed_time) == (download.speed_limit, download.speed_time)   # said once
    assert f"the index read within {index.deadline:g} s, each download within {download.deadline:,.0f} s" in text
    assert f"under {download.speed_limit:,} bytes a second arrive over {download.speed_time:g} s" in text
    for name in LIMITS_ENV.values():
        assert f"`{name}`" in text, name


def _partial(folder: Path) -> Path:
    return next(folder.glob("*.partial"))


def test_a_trickling_server_ends_at_the_minimum_rate_and_every_byte_is_kept(tmp_path):
    lim = Limits("download", deadline=30.0, speed_limit=1000, speed_time=0.5)
    t0 = time.monotonic()
    with serve(Site({"/b/x.mi100-bundle.zip": DATA}, trickle=0.01)) as site:
        with pytest.raises(NetworkError, match=r"sent \d+ bytes in 1 s, less than the minimum rate of 1,000 bytes a "
                           r"second \(\$MI100_CODEGEN_SPEED_LIMIT, \$MI100_CODEGEN_SPEED_TIME\)") as exc:
            fetch(want(site), tmp_path, step="downloading x", lim=lim)
    assert exc.value.exit_code == EXIT_UPSTREAM and time.monotonic() - t0 < 5
    kept = _partial(tmp_path).read_bytes()
    assert kept and kept == DATA[:len(kept)] and f"{len(kept):,} bytes are kept in" in exc.value.hint


def test_a_server_fast_enough_still_ends_at_the_deadline(tmp_path):
    lim = Limits("download", deadline=1.0, speed_limit=0, speed_time=0.5)
    t0 = time.monotonic()
    with serve(Site({"/b/x.mi100-bundle.zip": DATA}, trickle=0.002)) as site:
        with pytest.raises(NetworkError, match=r"did not finish within 1 s \(\$MI100_CODEGEN_DOWNLOAD_DEADLINE\)"):
            fetch(want(site), tmp_path, step="downloading x", lim=lim)
    assert time.monotonic() - t0 < 3
    kept = _partial(tmp_path).read_bytes()
    assert kept and kept == DATA[:len(kept)]


def test_headers_that_never_end_end_at_the_deadline():
    """The watchdog shuts the socket down wherever the read is: here in the response's headers."""
    lim = Limits("index", deadline=1.0, speed_limit=0, speed_time=0.5)
    t0 = time.monotonic()
    with serve(Site({"/i.json": b"{}"}, trickle_head=True, trickle=0.01)) as site:
        with pytest.raises(NetworkError, match=r"did not finish within 1 s \(\$MI100_CODEGEN_INDEX_DEADLINE\)"):
            fetch_bytes(site.url("/i.json"), limit=1000, step="reading the index", lim=lim)
    assert time.monotonic() - t0 < 3


def test_a_tls_handshake_never_answered_ends_at_the_deadline():
    """A server that accepts and says nothing: the read of the TLS handshake waits on a socket the
    TLS layer took over; the watchdog's duplicate of it ends the wait at the deadline, well before
    the speed time."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        t0 = time.monotonic()
        with pytest.raises(NetworkError, match=r"did not finish within 1 s"):
            fetch_bytes(f"https://127.0.0.1:{listener.getsockname()[1]}/i.json", limit=10, step="reading the index",
                        lim=Limits("index", deadline=1.0, speed_limit=0, speed_time=20.0))
    assert time.monotonic() - t0 < 3


def test_a_stalled_download_keeps_every_byte_and_resumes_from_the_last(tmp_path):
    lim = Limits("download", deadline=30.0, speed_limit=0, speed_time=0.5)
    with serve(Site({"/b/x.mi100-bundle.zip": DATA}, stall_after=1001)) as site:
        with pytest.raises(NetworkError, match="127.0.0.1:[0-9]+ sent nothing for 0.5 s"):
            fetch(want(site), tmp_path, step="downloading x", lim=lim)
        assert _partial(tmp_path).read_bytes() == DATA[:1001]
        with pytest.raises(NetworkError, match="sent nothing for 0.5 s"):   # the index read stalls alike
            fetch_bytes(site.url("/b/x.mi100-bundle.zip"), limit=len(DATA), step="reading", lim=lim)
        site.stall_after = None
        assert fetch(want(site), tmp_path, step="downloading x", lim=lim).read_bytes() == DATA
        assert site.requests[-1] == ("/b/x.mi100-bundle.zip", "bytes=1001-")


def test_ctrl_c_while_a_read_waits_keeps_the_bytes_received(tmp_path):
    """A read of 1 MiB used to hold what it had received until it was whole: an interrupt lost it."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        with serve(Site({"/b/x.mi100-bundle.zip": DATA}, stall_after=1001)) as site:
            signal.setitimer(signal.ITIMER_REAL, 1.0)
            with pytest.raises(KeyboardInterrupt):
                fetch(want(site), tmp_path, step="downloading x")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert _partial(tmp_path).read_bytes() == DATA[:1001]
