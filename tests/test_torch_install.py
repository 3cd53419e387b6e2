"""`mi100-codegen torch status|install|restore|rebuild-recipe` on real ELF fixtures: tiny shared libraries built with the system C compiler,
laid out like a ROCm torch install (torch/lib/libtorch_hip.so needing libaotriton_v2.so.0.11.0)
and like an AOTriton install prefix. Symbols carry Itanium-mangled names in namespace
`aotriton` (through asm labels, so plain C suffices)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import json
from pathlib import Path

import pytest

CC = shutil.which("gcc") or shutil.which("cc")

# the API our fake torch uses, as mangled names
SYM_FWD = "_ZN8aotriton2v25flash8attn_fwdEv"
SYM_BWD = "_ZN8aotriton2v25flash8attn_bwdEv"
SYM_CHECK = "_ZN8aotriton2v25flash9check_gpuEv"
SYM_EXTRA = "_ZN8aotriton2v25flash11unused_thisEv"  # defined, not used by torch


def need_cc() -> str:
    if CC is None:
        pytest.skip("needs a C compiler (gcc) to build the ELF fixtures")
    return CC


def _cc(out: Path, src: str, *flags: str) -> None:
    tmp = Path(str(out) + ".src.c")
    tmp.write_text(src)
    subprocess.run([need_cc(), "-shared", "-fPIC", "-O0", "-o", str(out), str(tmp), *flags],
                   check=True, capture_output=True)
    tmp.unlink()


def aot_source(tag: str, symbols: list[str], namespace: str = "aotriton") -> str:
    lines = []
    for i, s in enumerate(symbols):
        s = s.replace("8aotriton", f"{len(namespace)}{namespace}")
        lines.append(f'const char *f{i}(void) __asm__("{s}");')
        lines.append(f'const char *f{i}(void) {{ return "{tag}"; }}')
    return "\n".join(lines) + "\n"


def build_aot(path: Path, tag: str, version: str = "0.11.0", symbols: list[str] | None = None,
              namespace: str = "aotriton", soname: str | None = None) -> Path:
    syms = symbols if symbols is not None else [SYM_FWD, SYM_BWD, SYM_CHECK, SYM_EXTRA]
    path.parent.mkdir(parents=True, exist_ok=True)
    _cc(path, aot_source(tag, syms, namespace), f"-Wl,-soname,{soname or path.name}")
    return path


def build_torch(site: Path, version: str = "2.9.0+rocm6.4", hip: str | None = "6.4.43482",
                aot_version: str = "0.11.0", hip_lib: bool = True, images: bool = True) -> Path:
    """site/torch/{version.py, lib/libtorch_hip.so, lib/libaotriton_v2.so.X, lib/aotriton.images/}."""
    root = site / "torch"
    lib = root / "lib"
    lib.mkdir(parents=True)
    (root / "__init__.py").write_text("# fake torch for mi100-codegen tests\n")
    (root / "version.py").write_text(
        f"__version__ = '{version}'\ndebug = False\ncuda = {None if hip else repr('12.8')!s}\n"
        f"git_version = '0123456789abcdef'\nhip = {repr(hip) if hip else None}\nxpu = None\n"
    )
    if hip_lib:
        aot_name = f"libaotriton_v2.so.{aot_version}"
        build_aot(lib / aot_name, "original", aot_version)
        src = (
            f'const char *fwd(void) __asm__("{SYM_FWD}");\n'
            f'const char *bwd(void) __asm__("{SYM_BWD}");\n'
            f'const char *chk(void) __asm__("{SYM_CHECK}");\n'
            "const char *which_aotriton(void) { bwd(); chk(); return fwd(); }\n"
        )
        # the wheel scripts set DT_RPATH (patchelf --force-rpath), not DT_RUNPATH
        _cc(lib / "libtorch_hip.so", src, f"-L{lib}", f"-l:{aot_name}", "-Wl,-rpath,$ORIGIN",
            "-Wl,--disable-new-dtags", "-Wl,--no-as-needed")
        (lib / "libc10_hip.so").write_bytes(b"not an ELF, unrelated file\n")
    if images:
        img = lib / "aotriton.images" / "amd-gfx90a" / "flash" / "attn_fwd"
        img.mkdir(parents=True)
        (img / "FONLY__fp16.aks2").write_bytes(os.urandom(256))
        (lib / "aotriton.images" / "amd-gfx90a" / "flash" / "bwd.aks2").write_bytes(os.urandom(64))
    return root


def build_prefix(base: Path, version: str = "0.11.0", arch: str = "gfx908", suffix: str = "",
                 symbols: list[str] | None = None, namespace: str = "aotriton", images: bool = True) -> Path:
    prefix = base
    lib = prefix / "lib"
    lib.mkdir(parents=True)
    name = f"libaotriton{suffix}_v2.so.{version}"
    build_aot(lib / name, "mi100", version, symbols, namespace)
    (lib / f"libaotriton{suffix}_v2.so").symlink_to(name)
    (prefix / "include" / "aotriton").mkdir(parents=True)
    (prefix / "include" / "aotriton" / "config.h").write_text("#define AOTRITON_NS aotriton\n")
    if images:
        d = lib / "aotriton.images" / f"amd-{arch}" / "flash"
        (d / "attn_fwd").mkdir(parents=True)
        (d / "attn_fwd" / "FONLY__fp16.aks2").write_bytes(os.urandom(300))
        (d / "bwd_kernel_dk_dv.aks2").write_bytes(os.urandom(200))
        (d / "bwd_kernel_dq.aks2").write_bytes(os.urandom(200))
    return prefix


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root: type, mode, content hash (or link target) and file mtime."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in sorted(dirnames + filenames):
            p = Path(dirpath) / n
            rel = p.relative_to(root).as_posix()
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest(),
                            st.st_mtime_ns)
    return out


# --- tests ---------------------------------------------------------------------------------------
from typer.testing import CliRunner  # noqa: E402

from codegen.cli import app  # noqa: E402
from codegen.formats.elf import ElfError, read_dynamic  # noqa: E402
from codegen.ship.layout import aotriton_namespaces  # noqa: E402

runner = CliRunner()


def cli(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def site(tmp_path):
    need_cc()
    s = tmp_path / "site-packages"
    build_torch(s)
    return s


def load_which(torch_root: Path) -> str:
    """dlopen torch's libtorch_hip.so in a fresh process (RTLD_NOW) and ask which AOTriton it got."""
    code = (
        "import ctypes,sys\n"
        f"lib = ctypes.CDLL({str(torch_root / 'lib' / 'libtorch_hip.so')!r})\n"
        "lib.which_aotriton.restype = ctypes.c_char_p\n"
        "print(lib.which_aotriton().decode())\n"
    )
    r = subprocess.run(["python3", "-c", code], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "ERROR: " + r.stderr.strip().splitlines()[-1]


def test_elf_reader_on_fixtures(site):
    lib = site / "torch" / "lib"
    hip = read_dynamic(lib / "libtorch_hip.so")
    assert "libaotriton_v2.so.0.11.0" in hip.needed
    assert hip.rpath == ("$ORIGIN",) and hip.runpath == ()
    assert {SYM_FWD, SYM_BWD, SYM_CHECK} <= hip.undefined
    assert "which_aotriton" in hip.defined
    aot = read_dynamic(lib / "libaotriton_v2.so.0.11.0")
    assert aot.soname == "libaotriton_v2.so.0.11.0"
    assert {SYM_FWD, SYM_BWD, SYM_CHECK, SYM_EXTRA} <= aot.defined
    assert aotriton_namespaces(aot.defined) == {"aotriton"}
    with pytest.raises(ElfError, match="not an ELF file"):
        read_dynamic(lib / "libc10_hip.so")


def test_elf_reader_without_section_headers(site, tmp_path):
    """Stripped of section headers, the dynamic segment and DT_HASH/DT_GNU_HASH still give it all."""
    import struct

    src = site / "torch" / "lib" / "libaotriton_v2.so.0.11.0"
    data = bytearray(src.read_bytes())
    # e_shoff / e_shnum / e_shstrndx of ELF64 zeroed
    struct.pack_into("<Q", data, 0x28, 0)
    struct.pack_into("<HHH", data, 0x3A, 0, 0, 0)
    out = tmp_path / "stripped.so"
    out.write_bytes(bytes(data))
    a, b = read_dynamic(src), read_dynamic(out)
    assert b.soname == a.soname and b.needed == a.needed
    assert b.defined == a.defined and b.undefined == a.undefined


def test_status_reports_links_and_images(site):
    r = cli("torch", "status", "--torch-dir", str(site / "torch"), "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["torch_version"] == "2.9.0+rocm6.4"
    assert s["hip_version"] == "6.4.43482"
    assert s["rocm_build"] is True
    assert s["aotriton_needed"] == "libaotriton_v2.so.0.11.0"
    assert s["release_line"] == "0.11" and s["release_tag"] == "0.11b"
    assert s["expected_release_for_torch"] == "0.11b"
    assert s["images"] == {"amd-gfx90a": 2}
    assert s["ours_installed"] is False
    r = cli("torch", "status", "--torch-dir", str(site / "torch"))
    assert "links AOTriton:   libaotriton_v2.so.0.11.0" in r.stdout
    assert "our build:        not installed" in r.stdout


def test_install_then_restore_is_byte_identical(site, tmp_path):
    torch_root = site / "torch"
    prefix = build_prefix(tmp_path / "prefix")
    before = snapshot(site)
    assert load_which(torch_root) == "original"

    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(torch_root))
    assert r.exit_code == 0, r.output
    assert "installed:" in r.output
    # the dynamic linker now resolves torch's AOTriton symbols from our build
    assert load_which(torch_root) == "mi100"
    lib = torch_root / "lib"
    assert (lib / "libaotriton_v2.so.0.11.0").read_bytes() == (prefix / "lib" / "libaotriton_v2.so.0.11.0").read_bytes()
    ours = prefix / "lib" / "aotriton.images" / "amd-gfx908"
    for f in ours.rglob("*.aks2"):
        assert (lib / "aotriton.images" / "amd-gfx908" / f.relative_to(ours)).read_bytes() == f.read_bytes()
    assert (lib / "aotriton.images" / "amd-gfx90a" / "flash" / "bwd.aks2").is_file()  # others untouched
    backup = site / "torch.mi100-codegen-backup"
    m = json.loads((backup / "manifest.json").read_text())
    kinds = sorted((e["action"], e["path"]) for e in m["entries"])
    assert ("replace", "lib/libaotriton_v2.so.0.11.0") in kinds
    assert sum(1 for k, _ in kinds if k == "add") == 3
    for e in m["entries"]:
        if e["action"] == "replace":
            assert hashlib.sha256((backup / "files" / e["path"]).read_bytes()).hexdigest() == e["sha256_before"]

    s = json.loads(cli("torch", "status", "--torch-dir", str(torch_root), "--json").stdout)
    assert s["ours_installed"] is True and s["ours"]["library_matches_install"] is True
    assert s["images"]["amd-gfx908"] == 3

    # installing the same build again is a no-op
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(torch_root))
    assert r.exit_code == 0 and "identical" in r.output

    r = cli("torch", "restore", "--torch-dir", str(torch_root))
    assert r.exit_code == 0, r.output
    assert snapshot(site) == before
    assert load_which(torch_root) == "original"
    r = cli("torch", "restore", "--torch-dir", str(torch_root))
    assert r.exit_code == 2 and "nothing to restore" in r.output


def test_install_replaces_stale_images_of_the_same_arch(site, tmp_path):
    torch_root = site / "torch"
    stale = torch_root / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / "old.aks2"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"images of another build")
    before = snapshot(site)
    prefix = build_prefix(tmp_path / "prefix")
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(torch_root))
    assert r.exit_code == 2 and "--replace-shipped gfx908" in r.output and snapshot(site) == before, r.output
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(torch_root), "--replace-shipped", "gfx908")
    assert r.exit_code == 0, r.output
    assert not stale.exists()
    assert cli("torch", "restore", "--torch-dir", str(torch_root)).exit_code == 0
    assert snapshot(site) == before


def test_dry_run_changes_nothing(site, tmp_path):
    prefix = build_prefix(tmp_path / "prefix")
    before = snapshot(site)
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(site / "torch"), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "replace  lib/libaotriton_v2.so.0.11.0" in r.output and "dry run" in r.output
    assert snapshot(site) == before


REFUSALS = {
    "release_line": (dict(version="0.12.0"), "release line mismatch: torch 2.9.0+rocm6.4 links AOTriton 0.11b"),
    "missing_symbol": (dict(symbols=[SYM_FWD, SYM_CHECK]), "lacks 1 of the 3 AOTriton symbols"),
    "name_suffix": (dict(suffix="_mi100", namespace="aotriton_mi100"), "was built with AOTRITON_NAME_SUFFIX"),
    "suffix_namespace_only": (dict(namespace="aotriton_mi100"), "namespace aotriton_mi100"),
    "no_images": (dict(images=False), "no kernel images for gfx908"),
    "images_other_arch": (dict(arch="gfx90a"), "image folders in the prefix: amd-gfx90a"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_are_clear_and_change_nothing(site, tmp_path, case):
    kwargs, message = REFUSALS[case]
    prefix = build_prefix(tmp_path / "prefix", **kwargs)
    before = snapshot(site)
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(site / "torch"))
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output
    assert snapshot(site) == before


def test_missing_symbol_is_what_the_loader_would_say(site, tmp_path):
    """The refused build really fails to load: dlopen reports the undefined symbol."""
    prefix = build_prefix(tmp_path / "prefix", symbols=[SYM_FWD, SYM_CHECK])
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(site / "torch"))
    assert SYM_BWD in r.output
    lib = site / "torch" / "lib" / "libaotriton_v2.so.0.11.0"
    shutil.copy2(prefix / "lib" / "libaotriton_v2.so.0.11.0", lib)
    assert "undefined symbol" in load_which(site / "torch")


def test_point_release_is_accepted_under_torchs_name(site, tmp_path):
    prefix = build_prefix(tmp_path / "prefix", version="0.11.2")
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(site / "torch"), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "ABI-compatible" in r.output


def test_refuses_cuda_torch_and_static_link(tmp_path):
    need_cc()
    cuda_site = tmp_path / "cuda"
    build_torch(cuda_site, version="2.11.0+cu128", hip=None, hip_lib=False, images=False)
    prefix = build_prefix(tmp_path / "prefix")
    before = snapshot(cuda_site)
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(cuda_site / "torch"))
    assert r.exit_code == 2 and "is a CUDA build" in " ".join(r.output.split())
    assert snapshot(cuda_site) == before
    s = json.loads(cli("torch", "status", "--torch-dir", str(cuda_site / "torch"), "--json").stdout)
    assert s["rocm_build"] is False and s["cuda_version"] == "12.8"


def test_second_install_of_another_build_refused(site, tmp_path):
    p1 = build_prefix(tmp_path / "p1")
    p2 = build_prefix(tmp_path / "p2")
    assert cli("torch", "install", "--prefix", str(p1), "--torch-dir", str(site / "torch")).exit_code == 0
    mid = snapshot(site)
    r = cli("torch", "install", "--prefix", str(p2), "--torch-dir", str(site / "torch"))
    assert r.exit_code == 2 and "already installed" in r.output
    assert snapshot(site) == mid


def test_restore_refuses_when_files_changed_since(site, tmp_path):
    prefix = build_prefix(tmp_path / "prefix")
    assert cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(site / "torch")).exit_code == 0
    image = site / "torch" / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / "bwd_kernel_dq.aks2"
    image.write_bytes(b"changed by hand")
    r = cli("torch", "restore", "--torch-dir", str(site / "torch"))
    assert r.exit_code == 2 and "changed since install" in r.output and "--force" in r.output
    r = cli("torch", "restore", "--torch-dir", str(site / "torch"), "--force")
    assert r.exit_code == 0, r.output
    assert load_which(site / "torch") == "original" and not image.exists()


def test_restore_never_puts_back_a_library_the_backup_does_not_vouch_for(site, tmp_path):
    """Issue 36 item 3 (red team item 7): torch's library is not the one the backup records
    installing (torch reinstalled since, or a backup of another torch): refused, --force or not,
    and the message does not suggest --force."""
    prefix = build_prefix(tmp_path / "prefix")
    assert cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(site / "torch")).exit_code == 0
    lib = site / "torch" / "lib" / "libaotriton_v2.so.0.11.0"
    lib.write_bytes(b"reinstalled by pip")
    before = snapshot(site)
    for force in ((), ("--force",)):
        r = cli("torch", "restore", "--torch-dir", str(site / "torch"), *force)
        assert r.exit_code == 2, r.output
        assert "not the library the backup" in r.output and "--force" not in r.output, r.output
    assert snapshot(site) == before


def test_failed_install_rolls_back(site, tmp_path, monkeypatch):
    from codegen.apply import journal

    prefix = build_prefix(tmp_path / "prefix")
    before = snapshot(site)
    real = journal.os.replace
    calls = {"n": 0}

    def flaky(src, dest):
        if "txn/new" in str(src):
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError(28, "No space left on device")
        real(src, dest)

    monkeypatch.setattr(journal.os, "replace", flaky)
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(site / "torch"))
    assert r.exit_code == 3 and "rolled back" in r.output, r.output
    assert calls["n"] == 3
    assert snapshot(site) == before


def test_rebuild_recipe_prints_the_matching_torch(tmp_path):
    need_cc()
    prefix = build_prefix(tmp_path / "prefix", version="0.11.0")
    r = cli("torch", "rebuild-recipe", "--prefix", str(prefix))
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "--branch release/2.9" in out
    assert "export PYTORCH_ROCM_ARCH=gfx908" in out
    assert f"export AOTRITON_INSTALLED_PREFIX={prefix.resolve()}" in out
    assert "unset AOTRITON_INSTALL_FROM_SOURCE" in out
    assert "tools/amd_build/build_amd.py" in out
    r = cli("torch", "rebuild-recipe", "--release", "0.11.2b")
    assert "--branch release/2.11" in r.stdout
    r = cli("torch", "rebuild-recipe", "--release", "0.99b")
    assert r.exit_code == 2 and "no known PyTorch release links AOTriton 0.99b" in r.output


def test_rebuild_recipe_run_needs_rocm(tmp_path, monkeypatch):
    need_cc()
    prefix = build_prefix(tmp_path / "prefix")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    r = cli("torch", "rebuild-recipe", "--prefix", str(prefix), "--run", "--workdir", str(tmp_path / "w"))
    assert r.exit_code == 3 and "no ROCm found" in r.output  # a missing environment (docs/reference/exit-codes.md)
    assert not (tmp_path / "w").exists()


def test_status_without_torch_is_clear(tmp_path):
    r = cli("torch", "status", "--torch-dir", str(tmp_path))
    assert r.exit_code == 2 and "not a torch package folder" in r.output


@pytest.mark.parametrize("hostile", ["../../victim.txt", "/tmp/victim.txt", "lib/../../victim.txt", "created_dirs"])
def test_planted_backup_manifest_cannot_reach_outside_torch(site, tmp_path, hostile):
    """Issue 20: the backup manifest is a state file; a path in it that leads out of the torch folder
    is one message, exit 2, and nothing changes anywhere."""
    prefix = build_prefix(tmp_path / "prefix")
    assert cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(site / "torch")).exit_code == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    backup = site / "torch.mi100-codegen-backup"
    man = json.loads((backup / "manifest.json").read_text())
    if hostile == "created_dirs":
        man["created_dirs"].append("..")
    else:
        man["entries"].append({"path": hostile, "action": "add", "sha256_before": None,
                               "sha256_after": "0" * 64})
    (backup / "manifest.json").write_text(json.dumps(man))
    before = snapshot(site)
    for force in ((), ("--force",)):
        r = cli("torch", "restore", "--torch-dir", str(site / "torch"), *force)
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert victim.read_text() == "precious\n" and snapshot(site) == before
