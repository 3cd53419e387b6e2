"""Fetching what an index names (codegen.ship.fetch) from a loopback HTTP server (tests/loopback.py):
verified by size and sha256 before anyone opens it, a download cut midway and resumed with an HTTP
Range, a server that ignores the range, a size or sha256 that lies, an unreachable server, and the
URL rule (https, plain http only to this machine, redirects under the same rule)."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest

from codegen.core.errors import EXIT_UPSTREAM, EXIT_USER, UserError
from codegen.ship.fetch import NetworkError, Wanted, check_url, fetch, fetch_bytes
from loopback import Site, serve

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
