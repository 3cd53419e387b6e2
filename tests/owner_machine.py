"""Fake owner machines for the owner's command (`torch status`, `torch install --bundle auto`): a
sysfs root whose KFD topology lists the GPUs a card family's machine has, and ROCm torch folders
shaped as pytorch.org's wheels leave them (the ELF fixtures of test_torch_install.py and
test_torch_hip_runtime.py: real shared libraries built with gcc): torch 2.9 on ROCm 6.4 (AOTriton
0.11b), torch 2.14 on ROCm 7 (0.13b), and a wheel built with flash attention off (libtorch_hip.so
links no AOTriton: AMD's per-family TheRock wheels for gfx90X/gfx103X)."""

from __future__ import annotations

from pathlib import Path

from test_torch_hip_runtime import fake_hip
from test_torch_install import SYM_BWD, SYM_CHECK, SYM_FWD, _cc, build_aot, need_cc

# KFD's gfx_target_version per card family's processor
TARGET_VERSION = {"gfx908": 90008, "gfx906": 90006, "gfx1030": 100300, "gfx1031": 100301, "gfx90a": 90010,
                  "gfx1100": 110000}


def sysfs(root: Path, *archs: str) -> Path:
    """`root` as a sysfs root: node 0 a CPU (gfx_target_version 0), then one node per arch."""
    nodes = root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    values = [0] + [TARGET_VERSION[a] for a in archs]
    for i, v in enumerate(values):
        (nodes / str(i)).mkdir(parents=True)
        (nodes / str(i) / "properties").write_text(
            f"cpu_cores_count {16 if v == 0 else 0}\nsimd_count {0 if v == 0 else 480}\n"
            f"gfx_target_version {v}\nvendor_id 4098\n")
    return root


# the wheels: torch version, torch.version.hip, the ROCm major its HIP runtime has, the AOTriton
# version libtorch_hip.so needs (None: flash attention built off)
WHEELS = {
    "2.9-rocm6.4": ("2.9.1+rocm6.4", "6.4.43484", 6, "0.11.0"),
    "2.14-rocm7": ("2.14.0+rocm7.1", "7.1.25424", 7, "0.13.0"),
    "flash-off": ("2.9.1+rocm7.10.0", "7.10.25452", 7, None),
}


def wheel(site: Path, kind: str, uses: bool = True) -> Path:
    """site/torch laid out as a ROCm wheel of `kind` (WHEELS): version.py, the HIP runtime shipped
    as torch/lib/libamdhip64.so (SONAME libamdhip64.so.<major>), libtorch_hip.so needing it under
    the unversioned name, and the AOTriton library it needs (none for flash-off), DT_RPATH $ORIGIN.
    `uses`: libtorch_hip.so calls the fixtures' AOTriton symbols (False: it only needs the file, so
    a real library with real signatures can go in)."""
    need_cc()
    version, hip, major, aot = WHEELS[kind]
    root = site / "torch"
    lib = root / "lib"
    lib.mkdir(parents=True)
    (root / "__init__.py").write_text("# fake torch for mi100-codegen tests\n")
    (root / "version.py").write_text(f"__version__ = '{version}'\ndebug = False\ncuda = None\n"
                                     f"git_version = '0123456789abcdef'\nhip = '{hip}'\nxpu = None\n")
    fake_hip(lib / "libamdhip64.so", major)
    link = site / "link-time"
    link.mkdir()
    _cc(link / "libamdhip64.so", "int hipInit(unsigned f) { return (int)f; }\n", "-Wl,-soname,libamdhip64.so")
    if aot is None:
        src = "int hipInit(unsigned);\nconst char *which_aotriton(void) { hipInit(0); return \"none\"; }\n"
        aot_link: tuple[str, ...] = ()
    else:
        build_aot(lib / f"libaotriton_v2.so.{aot}", "original", aot)
        src = (f'const char *fwd(void) __asm__("{SYM_FWD}");\nconst char *bwd(void) __asm__("{SYM_BWD}");\n'
               f'const char *chk(void) __asm__("{SYM_CHECK}");\nint hipInit(unsigned);\n'
               "const char *which_aotriton(void) { hipInit(0); bwd(); chk(); return fwd(); }\n") if uses else \
            "int hipInit(unsigned);\nint which_hip(void) { return hipInit(0); }\n"
        aot_link = (f"-L{lib}", f"-l:libaotriton_v2.so.{aot}")
    _cc(lib / "libtorch_hip.so", src, "-Wl,--no-as-needed", f"-L{link}", *aot_link, "-l:libamdhip64.so",
        "-Wl,-rpath,$ORIGIN", "-Wl,--disable-new-dtags")
    img = lib / "aotriton.images" / "amd-gfx90a" / "flash"
    if aot is not None:
        img.mkdir(parents=True)
        (img / "attn_fwd.aks2").write_bytes(b"gfx90a image of the wheel\n")
    return root
