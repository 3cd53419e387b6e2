"""`torch install --bundle FILE` on the ELF fixtures of test_torch_install.py: a bundle made
from a fixture prefix (its library linked against a HIP 6 runtime, test_torch_hip_runtime.py) with
the bundle writer (codegen.formats.bundle_zip), installed into a wheel-shaped ROCm torch, reported
by `status`, restored byte for byte; a tampered, truncated, wrong-arch or too-new-glibc bundle is
one message, exit 2, nothing touched."""

from __future__ import annotations

import json
from pathlib import Path

from codegen.formats.bundle_zip import FORMAT, bundle_name, manifest_of, write_bundle
from codegen.core.fsutil import sha256
from codegen.formats.elf import read_dynamic
from codegen.ship.install import machine_glibc
from codegen.upstream.releases import IMAGES_DIR as IMAGES
import pytest

from test_bundle_units import aks2
from test_torch_hip_runtime import prefix_with_hip, torch_with_hip
from test_torch_install import cli, load_which, need_cc, site, snapshot  # noqa: F401 (site: the fixture)


@pytest.fixture
def wheel(tmp_path):
    """site-packages holding a ROCm torch laid out as PyTorch's wheel scripts leave one (HIP 6
    runtime shipped in torch/lib, test_torch_hip_runtime.torch_with_hip)."""
    need_cc()
    torch_with_hip(tmp_path / "wheel", 6)
    return tmp_path / "wheel"


def make_bundle(tmp_path: Path, arch: str = "gfx908", glibc: str | None = None, hip: int = 6,
                out_dir: Path | None = None, **fields) -> Path:
    """A bundle of AOTriton 0.11b for `arch` and HIP `hip` (its library linked against
    `libamdhip64.so.<hip>`, naming its image packages as a built library's dispatch tables do,
    each package a valid AKS2 one around the fixture's bytes), written to `out_dir` (default
    `tmp_path`); `fields`: more manifest fields (`built_with`, `torch_lines`, …)."""
    prefix = prefix_with_hip(tmp_path / f"prefix-{arch}-{hip}", hip, arch=arch)
    lib = prefix / "lib" / "libaotriton_v2.so.0.11.0"
    files = {f"lib/{lib.name}": lib.read_bytes()}
    for p in sorted((prefix / "lib" / "aotriton.images").rglob("*")):
        if p.is_file():
            files[p.relative_to(prefix).as_posix()] = aks2({"kernel": p.read_bytes()})
    files[f"lib/{lib.name}"] += b"".join(b"\0" + n.removeprefix(f"lib/{IMAGES}/").removesuffix(".aks2").encode() + b"\0"
                                         for n in files if n.startswith(f"lib/{IMAGES}/"))
    dyn = read_dynamic(lib)
    manifest = {"format": FORMAT, "label": "CPU-built, dispatch emulated; never run on a card", "release": "0.11b",
                "arch": arch, "hip_major": hip, "spec": {"sha256": "0" * 64},
                "library": {"file": f"lib/{lib.name}", "needs": {"glibc": glibc or dyn.highest("GLIBC"), "glibcxx": None}},
                "files": {n: {"sha256": sha256(b), "size": len(b)} for n, b in files.items()}, **fields}
    out = (out_dir or tmp_path) / bundle_name("0.11b", arch, hip)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bundle(out, manifest_of(manifest, str(out)), files)
    return out


def test_install_bundle_status_restore(wheel, tmp_path):
    site = wheel
    torch_root = site / "torch"
    b = make_bundle(tmp_path)
    before = snapshot(site)
    r = cli("torch", "install", "--bundle", str(b), "--torch-dir", str(torch_root))
    assert r.exit_code == 0, r.output
    assert "installed: bundle aotriton-0.11b-gfx908-hip6.mi100-bundle.zip" in r.output
    assert load_which(torch_root) == "mi100"
    s = json.loads(cli("torch", "status", "--torch-dir", str(torch_root), "--json").stdout)
    assert s["ours"]["bundle"]["file"] == b.name and s["ours"]["bundle"]["sha256"] == sha256(b.read_bytes())
    assert s["ours"]["bundle"]["hip_major"] == 6 and s["ours"]["arch"] == "gfx908"
    text = cli("torch", "status", "--torch-dir", str(torch_root)).stdout
    assert "bundle:           aotriton-0.11b-gfx908-hip6.mi100-bundle.zip  (AOTriton 0.11b, gfx908, HIP 6" in text
    assert (torch_root / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / "bwd_kernel_dq.aks2").is_file()
    r = cli("torch", "restore", "--torch-dir", str(torch_root))
    assert r.exit_code == 0, r.output
    assert snapshot(site) == before


def _refused(site, args, words):
    before = snapshot(site)
    r = cli("torch", "install", *args, "--torch-dir", str(site / "torch"))
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output, r.output
    assert snapshot(site) == before


def test_tampered_bundle_is_refused(site, tmp_path):
    import zipfile

    b = make_bundle(tmp_path)
    t = tmp_path / "tampered.zip"
    with zipfile.ZipFile(b) as zin, zipfile.ZipFile(t, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("bwd_kernel_dq.aks2"):
                data = data[:-1] + bytes([data[-1] ^ 1])
            zout.writestr(info, data)
    _refused(site, ["--bundle", str(t)], "does not match the manifest")


def _relinked(bundle: Path, names: list[str], drop: str | None = None) -> Path:
    """`bundle` rewritten whole, every hash recomputed (the attack of issue 30 item 5): its library
    also naming the image packages `names` (NUL-terminated strings, as a built library's dispatch
    tables hold them) and, with `drop`, without that file."""
    import zipfile

    with zipfile.ZipFile(bundle) as z:
        files = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
        manifest = json.loads(z.read("manifest.json"))
    lib = manifest["library"]["file"]
    files[lib] += b"".join(b"\0" + n.encode() + b"\0" for n in names)
    files.pop(drop, None)
    manifest["files"] = {n: {"sha256": sha256(b), "size": len(b)} for n, b in files.items()}
    write_bundle(bundle, manifest_of(manifest, str(bundle)), files)
    return bundle


def test_bundle_missing_a_package_its_library_names_is_refused(wheel, tmp_path):
    """A bundle with a package its library dispatches to removed, every hash recomputed, passes the
    member checks; install makes bundle check's static package claim again and refuses it."""
    torch_root = wheel / "torch"
    fwd = "amd-gfx908/flash/attn_fwd/FONLY__fp16"
    ok = _relinked(make_bundle(tmp_path / "a"), [fwd])
    r = cli("torch", "install", "--bundle", str(ok), "--torch-dir", str(torch_root), "--dry-run")
    assert r.exit_code == 0, r.output   # the package it names is packed
    before = snapshot(wheel)
    bad = _relinked(make_bundle(tmp_path / "b"), [fwd], drop=f"lib/aotriton.images/{fwd}.aks2")
    r = cli("torch", "install", "--bundle", str(bad), "--torch-dir", str(torch_root))
    assert r.exit_code == 2, r.output
    assert "every image package the library names is in the bundle" in r.output and f"missing: {fwd}.aks2" in r.output
    assert "Traceback" not in r.output
    assert snapshot(wheel) == before


def test_truncated_or_foreign_files_are_refused(site, tmp_path):
    b = make_bundle(tmp_path)
    cut = tmp_path / "cut.zip"
    cut.write_bytes(b.read_bytes()[: b.stat().st_size // 2])
    _refused(site, ["--bundle", str(cut)], "not a bundle or a truncated one")
    _refused(site, ["--bundle", str(tmp_path)], "not a regular file")


def test_wrong_arch_and_newer_glibc_are_refused(site, tmp_path):
    b = make_bundle(tmp_path / "a", arch="gfx1030")
    _refused(site, ["--bundle", str(b), "--arch", "gfx908"], "a bundle for gfx1030, not gfx908")
    have = machine_glibc()
    assert have and have.startswith("GLIBC_2.")
    newer = "GLIBC_2." + str(int(have.split(".")[1]) + 1)
    b = make_bundle(tmp_path / "b", glibc=newer)
    _refused(site, ["--bundle", str(b)], f"its library needs {newer}, this machine has {have}")


def test_prefix_xor_bundle(site, tmp_path):
    _refused(site, [], "give one of --prefix PREFIX or --bundle FILE")


def _big_package(path: Path, size: int) -> str:
    """A valid AKS2 package of about `size` bytes written to `path` in 1 MiB pieces (nothing of
    its size held here): one kernel of incompressible bytes, so the xz stream, and the bundle
    member, is as large as what it holds. Its sha256."""
    import hashlib
    import lzma
    import random
    import struct

    name = b"big\0"
    directory = struct.pack("<IIIII", 0, 256, 0, size, len(name)) + name
    rng, comp, h = random.Random(size), lzma.LZMACompressor(preset=0), hashlib.sha256()
    with open(path, "wb") as f:
        def put(data: bytes) -> None:
            h.update(data)
            f.write(data)
        put(struct.pack("<4sIII", b"AKS2", len(directory) + size, 1, len(directory)) + comp.compress(directory))
        for i in range(0, size, 1 << 20):
            put(comp.compress(rng.randbytes(min(1 << 20, size - i))))
        put(comp.flush())
    return h.hexdigest()


def _big_bundle(tmp_path: Path, members: int, size: int) -> Path:
    """A bundle of the fixture library and `members` image packages of about `size` bytes each,
    valid AKS2 packages it names (as a built library names its packages), written streamed:
    the members add up to members x size bytes in the file too."""
    import shutil
    import stat
    import zipfile

    from codegen.formats.bundle_zip import MANIFEST

    small = make_bundle(tmp_path / f"mk{size}")
    with zipfile.ZipFile(small) as z:
        files = {n: z.read(n) for n in z.namelist() if n != MANIFEST}
        manifest = json.loads(z.read(MANIFEST))
    names = [f"amd-gfx908/flash/big{i}" for i in range(members)]
    lib = manifest["library"]["file"]
    files[lib] += b"".join(b"\0" + n.encode() + b"\0" for n in names)
    package = tmp_path / f"big{size}.aks2"
    digest = _big_package(package, size)
    manifest["files"] = {n: {"sha256": sha256(b), "size": len(b)} for n, b in files.items()}
    manifest["files"].update({f"lib/aotriton.images/{n}.aks2": {"sha256": digest, "size": package.stat().st_size}
                              for n in names})
    out = tmp_path / f"big{size}" / bundle_name("0.11b", "gfx908", 6)
    out.parent.mkdir()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(MANIFEST, json.dumps(manifest))
        for n, b in files.items():
            z.writestr(n, b)
        for n in names:
            info = zipfile.ZipInfo(f"lib/aotriton.images/{n}.aks2", (2026, 1, 1, 0, 0, 0))
            info.external_attr, info.compress_type = (stat.S_IFREG | 0o644) << 16, zipfile.ZIP_STORED
            with z.open(info, "w", force_zip64=True) as w, open(package, "rb") as r:
                shutil.copyfileobj(r, w, 1 << 20)
    return out


def _peak_rss_mib(args: list[str]) -> tuple[int, str]:
    """The command run in a child Python; its peak resident memory (MiB: VmHWM, its own address
    space's high-water mark; ru_maxrss would also count this process's memory at the fork) and its
    output."""
    import subprocess
    import sys

    code = ("import resource, sys\nfrom codegen.cli import main\nsys.argv = ['mi100-codegen'] + sys.argv[1:]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
            "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
            "sys.stderr.write(f'\\nexit {code} peak {hwm}\\n')\n")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    last = r.stderr.strip().splitlines()[-1].split()
    assert last[:2] == ["exit", "0"], r.stderr
    return int(last[3]) // 1024, r.stderr


def test_install_holds_no_member_in_memory_whatever_the_bundle_size(wheel, tmp_path):
    """Issue 36 item 12: `torch install --bundle --dry-run` of a bundle whose images add up to
    256 MiB (4 x 64 MiB) peaks within 32 MiB of the same command on a bundle of 4 x 1 MiB:
    members are streamed (codegen.formats.bundle_zip), never held (360f28b held them all, and
    the file: 5.2 GB for 4 x 1000 MiB; figures in docs/measurements.md)."""
    torch_root = wheel / "torch"
    runs = {}
    for members, size in ((4, 1 << 20), (4, 64 << 20)):
        b = _big_bundle(tmp_path, members, size)
        runs[size], out = _peak_rss_mib(["torch", "install", "--bundle", str(b), "--torch-dir", str(torch_root),
                                         "--dry-run"])
        assert "dry run: would 7 add, 1 replace" in out, out
    print(f"\npeak RSS (MiB) by member size: {runs}")   # -s shows it (docs/measurements.md)
    assert runs[64 << 20] - runs[1 << 20] < 32, runs


# --- one verdict: bundle check and torch install refuse the same bundles (issue 36 item 7) -------
def _resigned(bundle: Path, edit) -> Path:
    """`bundle` rewritten whole by `edit(files, manifest)`, every hash recomputed: a bundle changed
    in one property and signed again, which the member checks pass."""
    import zipfile

    with zipfile.ZipFile(bundle) as z:
        files = {n: z.read(n) for n in z.namelist() if n != "manifest.json"}
        manifest = json.loads(z.read("manifest.json"))
    edit(files, manifest)
    manifest["files"] = {n: {"sha256": sha256(b), "size": len(b)} for n, b in files.items()}
    write_bundle(bundle, manifest_of(manifest, str(bundle)), files)
    return bundle


def _relabel(files: dict, manifest: dict) -> None:
    """The red team's item 8: the images moved to amd-gfx90a/, the manifest saying gfx90a."""
    for n in [n for n in files if "/amd-gfx908/" in n]:
        files[n.replace("/amd-gfx908/", "/amd-gfx90a/")] = files.pop(n)
    manifest["arch"] = "gfx90a"


def _second_library(files: dict, manifest: dict) -> None:
    files["lib/libaotriton_v2.so.0.11.1"] = files["lib/libaotriton_v2.so.0.11.0"]


def _corrupt_package(files: dict, manifest: dict) -> None:
    name = next(n for n in files if n.endswith("FONLY__fp16.aks2"))
    data = bytearray(files[name])
    data[len(data) // 2] ^= 0x55        # inside the xz stream
    files[name] = bytes(data)


def _names_nothing(files: dict, manifest: dict) -> None:
    lib = manifest["library"]["file"]
    files[lib] = files[lib][:files[lib].index(b"\0amd-gfx908/")]   # the package names make_bundle appended


RED_TEAM = {   # case: (edit, the verdict's claim that fails, torch install's extra arguments)
    "relabelled gfx90a": (_relabel, "every image package the library names is in the bundle (0 named for amd-gfx90a",
                          ["--arch", "gfx90a"]),
    "a second listed library": (_second_library, "one AOTriton library, the one the manifest names (lib/ holds "
                                "libaotriton_v2.so.0.11.0, libaotriton_v2.so.0.11.1", []),
    "a corrupt xz package": (_corrupt_package, "every kernel package decompresses whole (lib/aotriton.images/amd-gfx908/"
                             "flash/attn_fwd/FONLY__fp16.aks2: corrupt kernel package", []),
    "a claim over nothing": (_names_nothing, "every image package the library names is in the bundle (0 named for "
                             "amd-gfx908", []),
}


def test_the_unchanged_bundle_passes_the_verdict(tmp_path):
    """The control of the cases below: make_bundle's bundle passes every claim, so each refusal is
    its one change."""
    from codegen.formats.bundle_zip import extract, open_bundle
    from codegen.ship.verdict import bundle_verdict
    from conftest import cached_sysroot

    sysroot = cached_sysroot(6)
    if sysroot is None:
        pytest.skip("needs the HIP 6 sysroot in the user cache (bundle build makes it)")
    need_cc()
    b = open_bundle(make_bundle(tmp_path))
    claims = bundle_verdict(extract(b, tmp_path / "x"), b.manifest, set(read_dynamic(sysroot.runtime).version_defs))
    assert all(c.ok for c in claims), [(c.name, c.detail) for c in claims if not c.ok]
    assert len(claims) >= 8 and any("1 named for amd-gfx908" in c.detail for c in claims)


@pytest.mark.parametrize("case", sorted(RED_TEAM))
def test_each_red_team_bundle_is_refused_by_check_and_install_alike(wheel, tmp_path, case):
    """The red team's bundles, each re-signed: `bundle check` fails the verdict's claim (exit 3,
    its dispatch never run) and `torch install --bundle` refuses naming the same claim (exit 2,
    torch untouched). Before, the relabelled bundle, the corrupt package and the claim over
    nothing installed, and the second library passed check."""
    from conftest import cached_sysroot

    if cached_sysroot(6) is None:
        pytest.skip("needs the HIP 6 sysroot in the user cache (bundle build makes it)")
    edit, claim, args = RED_TEAM[case]
    b = _resigned(make_bundle(tmp_path), edit)
    r = cli("bundle", "check", str(b))
    assert r.exit_code == 3 and "Traceback" not in r.output, r.output
    out = " ".join(r.output.split())
    assert f"FAIL {claim.replace(' (', ': ', 1)}" in out and "no emulated dispatch" in out, r.output
    before = snapshot(wheel)
    r = cli("torch", "install", "--bundle", str(b), "--torch-dir", str(wheel / "torch"), *args)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"refused by the bundle's verdict: {claim}" in " ".join(r.output.split()), r.output
    assert snapshot(wheel) == before


def test_kernels_torch_ships_for_the_arch_are_replaced_only_on_purpose(wheel, tmp_path):
    """A genuine gfx90a bundle into a wheel that ships gfx90a kernels: refused, torch untouched;
    with --replace-shipped gfx90a installed, torch's own kernels backed up, and restore puts them
    back byte for byte (the relabelled bundle of the red team removed torch's gfx90a image)."""
    torch_root = wheel / "torch"
    shipped = torch_root / "lib" / "aotriton.images" / "amd-gfx90a"
    assert any(p.is_file() for p in shipped.rglob("*"))
    b = make_bundle(tmp_path, arch="gfx90a")
    before = snapshot(wheel)
    r = cli("torch", "install", "--bundle", str(b), "--torch-dir", str(torch_root))
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "lib/aotriton.images/amd-gfx90a/ already holds 2 kernel file(s)" in out and "--replace-shipped gfx90a" in out
    assert snapshot(wheel) == before
    r = cli("torch", "install", "--bundle", str(b), "--torch-dir", str(torch_root), "--replace-shipped", "gfx908")
    assert r.exit_code == 2 and snapshot(wheel) == before, r.output   # another arch named: still refused
    r = cli("torch", "install", "--bundle", str(b), "--torch-dir", str(torch_root), "--replace-shipped", "gfx90a")
    assert r.exit_code == 0, r.output
    assert not (shipped / "flash" / "bwd.aks2").exists() and load_which(torch_root) == "mi100"
    r = cli("torch", "restore", "--torch-dir", str(torch_root))
    assert r.exit_code == 0, r.output
    assert snapshot(wheel) == before
