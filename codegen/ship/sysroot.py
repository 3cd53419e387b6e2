"""A private HIP sysroot per ROCm major: Debian's HIP headers and runtime, unpacked under the
cache folder, never installed over the system.

Debian carries HIP 6 (`libamdhip64-dev` 6.4.x, suite sid) and HIP 7 (7.2.x, suite experimental);
a Debian 12 machine's apt sources list bookworm only. The sysroot is made with an apt
configuration of our own (its own sources list, state, status and cache folders, under the cache
folder): its one source is the Debian mirror the machine already uses (read from
/etc/apt/sources.list and sources.list.d, one-line and deb822 formats) with the suite changed,
checked against the same keyring. `apt-get update`, `apt-get download`, `dpkg -x`: nothing runs
as an installation, the system's package state is never read or written.

Layout: `<cache>/hip-sysroot/hip<N>/` (`usr/include/hip/...`, `usr/lib/<triplet>/libamdhip64.so*`
and `sysroot.json`: suite, package versions, sha256 of each .deb). Created in a `.tmp-` folder
under a lock and renamed into place: a folder under its final name is complete.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock

from codegen.core import processes
from codegen.core.contain import inside
from codegen.core.errors import EnvironmentMissing, UserError
from codegen.core.fsutil import move_into_place, sha256_file
from codegen.core.resources import user_cache_dir
from codegen.models.hip import HIP_SOURCES, SYSROOT_FORMAT, SYSROOT_RECORD, HipSource, SysrootRecord
from codegen.models.records import read_record, write_json


@dataclass(frozen=True)
class Mirror:
    uri: str
    components: tuple[str, ...]
    signed_by: str | None
    origin: str               # the file it was read from


@dataclass(frozen=True)
class Sysroot:
    major: int
    root: Path
    record: SysrootRecord

    @property
    def include(self) -> Path:
        return self.root / "usr" / "include"

    @property
    def prefix(self) -> Path:
        """The `usr` folder: a CMake prefix (CMAKE_PREFIX_PATH) holding hip's config."""
        return self.root / "usr"

    @property
    def runtime(self) -> Path:
        """The real `libamdhip64.so.<major>` (a link in the package, resolved inside the root)."""
        return self.root / self.record.runtime


# --- the machine's Debian mirror ------------------------------------------------------------------
_ONE_LINE = re.compile(r"^\s*deb\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)\s*(?P<comps>.*)$")


def _is_main_suite(suite: str) -> bool:
    """The archive proper (`bookworm`, `stable`), not `-security`, `-updates`, `-backports`."""
    return bool(suite) and "-" not in suite and "/" not in suite


def _deb822(text: str, origin: str) -> list[Mirror]:
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0] in " \t" and key:
                fields[key] += " " + line.strip()
                continue
            k, _, v = line.partition(":")
            key = k.strip().lower()
            fields[key] = v.strip()
        if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
            continue
        suites = fields.get("suites", "").split()
        if not any(_is_main_suite(s) for s in suites):
            continue
        for uri in fields.get("uris", "").split():
            out.append(Mirror(uri.rstrip("/"), tuple(fields.get("components", "main").split()) or ("main",),
                              fields.get("signed-by") or None, origin))
    return out


def _one_line(text: str, origin: str) -> list[Mirror]:
    out = []
    for line in text.splitlines():
        m = _ONE_LINE.match(line.split("#", 1)[0])
        if not m or not _is_main_suite(m["suite"]):
            continue
        opts = dict(o.split("=", 1) for o in (m["opts"] or "").split() if "=" in o)
        out.append(Mirror(m["uri"].rstrip("/"), tuple(m["comps"].split()) or ("main",), opts.get("signed-by"), origin))
    return out


def debian_mirrors(etc_apt: Path = Path("/etc/apt")) -> list[Mirror]:
    """The Debian archive sources of this machine's apt configuration, in apt's reading order:
    `sources.list`, then `sources.list.d/*.list` and `*.sources` by name (other files, e.g. ones
    renamed `.disabled`, are ignored as apt ignores them). Only main-archive suites count."""
    files = [etc_apt / "sources.list"]
    d = etc_apt / "sources.list.d"
    if d.is_dir():
        files += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources"))
    out: list[Mirror] = []
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        out += _deb822(text, str(f)) if f.suffix == ".sources" else _one_line(text, str(f))
    # a Debian archive (its pool has the packages): prefer a URI whose path ends in /debian
    return sorted(out, key=lambda m: not m.uri.endswith("/debian"))


# --- the sysroot ---------------------------------------------------------------------------------
def default_root() -> Path:
    return user_cache_dir("hip-sysroot")


def _load(entry: Path, major: int) -> Sysroot | None:
    """The sysroot in `entry`, None when it is absent, incomplete or its record is not ours (it is
    made again). The record is read as possibly hostile (codegen.models.records), its runtime
    checked inside the sysroot (codegen.core.contain)."""
    try:
        rec = read_record(SysrootRecord, entry / SYSROOT_RECORD, what="HIP sysroot record")
        inside(entry, rec.runtime)
    except UserError:   # RecordError and Escape included
        return None
    if rec.major != major:
        return None
    s = Sysroot(major, entry, rec)
    if not (s.include / "hip" / "hip_runtime_api.h").is_file() or not s.runtime.is_file():
        return None
    return s


def find_sysroot(major: int, root: Path | None = None) -> Sysroot | None:
    return _load((root or default_root()) / f"hip{major}", major)


def _offline(src: HipSource, why: str, entry: Path) -> EnvironmentMissing:
    return EnvironmentMissing(
        f"cannot fetch Debian's HIP {src.major} packages ({', '.join(src.packages)}, suite {src.suite}) "
        f"from this machine's Debian mirror: {why}",
        hint=f"run the same command on a machine that reaches its Debian mirror (the HIP {src.major} "
             f"sysroot is made once, then cached), or copy {entry} from a machine where it was made")


def _run(cmd: list[str], env: dict, src: HipSource, entry: Path, cwd: Path | None = None) -> str:
    try:
        r = processes.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    except FileNotFoundError:
        raise EnvironmentMissing(f"{cmd[0]} is not installed: the HIP sysroot is made with Debian's apt and dpkg",
                                 hint="run this on Debian or a Debian derivative (apt-get, dpkg)") from None
    except subprocess.TimeoutExpired:
        raise _offline(src, f"{cmd[0]} {cmd[1]} did not finish in 15 min", entry) from None
    if r.returncode != 0 or (cmd[1] == "update" and re.search(r"^(E:|W: Failed to fetch)", r.stderr, re.M)):
        lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.startswith(("E:", "W:", "Err:"))]
        raise _offline(src, (lines[-1] if lines else f"{cmd[0]} {cmd[1]} exited {r.returncode}"), entry)
    return r.stdout


def _apt_env(apt: Path, mirror: Mirror, suite: str) -> dict:
    for d in ("state/lists/partial", "cache/archives/partial", "sources", "preferences"):
        (apt / d).mkdir(parents=True, exist_ok=True)
    (apt / "status").touch()
    stanza = ["Types: deb", f"URIs: {mirror.uri}", f"Suites: {suite}",
              f"Components: {' '.join(mirror.components)}"]
    if mirror.signed_by:
        stanza.append(f"Signed-By: {mirror.signed_by}")
    (apt / "sources" / "debian.sources").write_text("\n".join(stanza) + "\n")
    conf = {
        "Dir::Etc::SourceList": "/dev/null",
        "Dir::Etc::SourceParts": apt / "sources",
        "Dir::Etc::Preferences": "/dev/null",
        "Dir::Etc::PreferencesParts": apt / "preferences",
        "Dir::State": apt / "state",
        "Dir::State::status": apt / "status",
        "Dir::Cache": apt / "cache",
        "Acquire::Languages": "none",
        "APT::Sandbox::User": "root" if os.geteuid() == 0 else "",
    }
    (apt / "apt.conf").write_text("".join(f'{k} "{v}";\n' for k, v in conf.items() if v != ""))
    return {**os.environ, "APT_CONFIG": str(apt / "apt.conf"), "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}


def _fill(tmp: Path, major: int, src: HipSource, env: dict, entry: Path,
          progress: Callable[[str], None]) -> None:
    """Download the HIP `major` packages into `tmp`, unpack them there and write its record: the
    sysroot, before it is renamed into place."""
    debs = tmp / "debs"
    debs.mkdir()
    progress(f"HIP {major} sysroot: apt-get download {' '.join(src.packages)}")
    _run(["apt-get", "download", *src.packages], env, src, entry, cwd=debs)
    record: dict = {"format": SYSROOT_FORMAT, "major": major, "suite": src.suite, "packages": {}}
    for deb in sorted(debs.glob("*.deb")):
        name, version, _arch = deb.stem.split("_", 2)
        record["packages"][name] = {"version": version.replace("%3a", ":"), "file": deb.name,
                                    "sha256": sha256_file(deb)}
    dev = record["packages"].get(src.packages[0], {})
    if not str(dev.get("version", "")).startswith(f"{major}."):
        raise _offline(src, f"suite {src.suite} offers {src.packages[0]} {dev.get('version', 'none')}, "
                            f"not HIP {major}.x", entry)
    progress(f"HIP {major} sysroot: dpkg -x ({len(record['packages'])} packages, "
             f"{src.packages[0]} {dev['version']})")
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg", "-x", str(deb), str(tmp)], env, src, entry)
    shutil.rmtree(debs)
    lib = next(iter(sorted((tmp / "usr" / "lib").glob(f"*/libamdhip64.so.{major}"))), None)
    if lib is None or not (tmp / "usr" / "include" / "hip" / "hip_runtime_api.h").is_file():
        raise _offline(src, "the packages hold no hip/hip_runtime_api.h or "
                            f"libamdhip64.so.{major}", entry)
    real = lib.resolve()
    if tmp.resolve() not in real.parents:
        raise _offline(src, f"{lib.name} links outside the sysroot", entry)
    record["runtime"] = real.relative_to(tmp.resolve()).as_posix()
    # hip-config.cmake checks that its bin folder exists (hipcc's, from another package);
    # the runtime build uses the host compiler, so an empty one does
    (tmp / "usr" / "bin").mkdir(exist_ok=True)
    (tmp / SYSROOT_RECORD).write_bytes(write_json(SysrootRecord.model_validate(record)))


def ensure_sysroot(major: int, *, root: Path | None = None, etc_apt: Path = Path("/etc/apt"),
                   progress: Callable[[str], None] = lambda s: None) -> Sysroot:
    """The HIP `major` sysroot, made on first use (see the module doc)."""
    if major not in HIP_SOURCES:
        raise UserError(f"HIP {major}: no Debian source known (mi100-codegen makes sysroots for HIP "
                        f"{', '.join(map(str, sorted(HIP_SOURCES)))})")
    src = HIP_SOURCES[major]
    base = root or default_root()
    entry = base / f"hip{major}"
    found = _load(entry, major)
    if found is not None:
        return found
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentMissing(f"{base}: cannot create the HIP sysroot cache ({exc.strerror})") from None
    with FileLock(str(base / ".lock")):
        found = _load(entry, major)
        if found is not None:
            return found
        mirrors = debian_mirrors(etc_apt)
        if not mirrors:
            raise _offline(src, f"no Debian archive source in {etc_apt}/sources.list or sources.list.d", entry)
        mirror = mirrors[0]
        progress(f"HIP {major} sysroot: apt-get update (suite {src.suite} of the mirror in {mirror.origin})")
        env = _apt_env(base / f".apt-{src.suite}", mirror, src.suite)
        _run(["apt-get", "update"], env, src, entry)
        for stale in base.glob(f".tmp-hip{major}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-hip{major}-", dir=base))
        try:
            _fill(tmp, major, src, env, entry, progress)
            if entry.exists():
                shutil.rmtree(entry)
            move_into_place(tmp, entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        made = _load(entry, major)
        assert made is not None
        size = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file() and not p.is_symlink())
        progress(f"HIP {major} sysroot: ready at {entry} ({size / 1e6:.1f} MB)")
        return made
