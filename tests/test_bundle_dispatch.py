"""The dispatch driver (codegen/ship/stub/driver.cc) and bundle check's forced-backend probe
(codegen.ship.check.check_forced) on a CPU in seconds: the driver compiled against a release's
own headers (0.11b from the release archive) and linked, with the stub HIP runtime of the cached
HIP 6 sysroot (CI fetches it before pytest), against a stand-in library of ours. The stand-in's
entry points load and launch tiny code objects that the images folder also packs, so the
launches are named as in a real bundle; how it answers a forced fused backward is chosen per
test, and the verdict and its observed fields follow what happened. A real library's dispatch:
tests/test_bundle_real.py (`-m "build and slow"`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from codegen.formats.elf import AMDGPU_MACH
from codegen.formats.op_table import FUSED_BACKEND_INDEX, FUSED_FAMILY
from codegen.formats.bundle_zip import manifest_of
from codegen.models.bundle import BundleManifest, ClaimRecord
from codegen.ship.check import CheckReport, check_forced
from codegen.ship.coverage import coverage
from codegen.ship.dispatch import HIP_SUCCESS, check_cases, dispatch_cases, run_dispatch
from codegen.ship.stub import build_stub
from codegen.formats.spec import load_spec
from conftest import REPO, cached_sysroot
from test_bundle_stub import code_object
from test_bundle_units import aks2

SYS6 = cached_sysroot(6)
pytestmark = pytest.mark.skipif(SYS6 is None or shutil.which("g++") is None or shutil.which("gcc") is None,
                                reason="needs gcc, g++ and the cached HIP 6 sysroot (tests/test_bundle_sysroot.py -m slow)")

LIB = "lib/libaotriton_v2.so.0.11.0"
KERNELS = ("attn_fwd", "bwd_kernel_dk_dv", FUSED_FAMILY)
# The stand-in's answer to a backward forced onto the fused backend (MI100_FAKE_MODE); its fused
# kernel exists for the head dims in MI100_FAKE_FUSED only, as a bundle built with
# --kernels dispatched holds some fused packages and leaves others out.
STANDIN = r"""
#include <aotriton/flash.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ao = AOTRITON_NS;
template class ao::TensorView<1>;
template class ao::TensorView<2>;
template class ao::TensorView<4>;
ao::v3::flash::attn_fwd_params::attn_fwd_params() {}
ao::v3::flash::attn_bwd_params::attn_bwd_params() {}

// what a real library's dispatch tables keep: the path of each image package they name (PACKAGE_PATH)
extern "C" AOTRITON_API const char* const mi100_standin_packages[] = {
    "amd-gfx908/flash/attn_fwd/FONLY__", "amd-gfx908/flash/bwd_kernel_dk_dv/FONLY__", "amd-gfx908/flash/" FUSED "/FONLY__"};

namespace {
std::string env(const char* name) { const char* v = std::getenv(name); return v ? v : ""; }

hipError_t launch(hipFunction_t fn) {
  unsigned long long buffer = 0, value = 0;
  void* params[] = {&buffer, &value};
  return hipModuleLaunchKernel(fn, 4, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr);
}

hipError_t run(const char* kernel) {  // the code object <MI100_FAKE_IMAGES>/<kernel>.co
  static std::vector<std::vector<char>> images;  // a loaded image stays valid
  std::string path = env("MI100_FAKE_IMAGES") + "/" + kernel + ".co";
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return hipErrorFileNotFound;
  std::vector<char> data;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  images.push_back(data);
  hipModule_t mod;
  hipFunction_t fn;
  hipError_t e = hipModuleLoadDataEx(&mod, images.back().data(), 0, nullptr, nullptr);
  if (e == hipSuccess) e = hipModuleGetFunction(&fn, mod, kernel);
  return e == hipSuccess ? launch(fn) : e;
}
}  // namespace

hipError_t ao::v2::flash::check_gpu(ao::Stream) {
  int device = -1;
  return hipGetDevice(&device);
}

hipError_t ao::v3::flash::attn_fwd(const attn_fwd_params&, int32_t, ao::Stream, const attn_options*) {
  return run("attn_fwd");
}

hipError_t ao::v3::flash::attn_bwd(const attn_bwd_params& p, int32_t, ao::Stream, const attn_options* o) {
  if (!o || o->force_backend_index != FUSED_BACKEND) return run("bwd_kernel_dk_dv");
  std::string mode = env("MI100_FAKE_MODE"), head = " " + std::to_string(p.Q.size(3)) + " ";
  bool held = (" " + env("MI100_FAKE_FUSED") + " ").find(head) != std::string::npos;
  if (held && mode != "never-fused") return run(FUSED);
  if (mode == "fused-anyway") return run(FUSED);
  if (mode == "crash") std::abort();
  if (mode == "success") return hipSuccess;
  return hipModuleLaunchKernel(nullptr, 1, 1, 1, 64, 1, 1, 0, nullptr, nullptr, nullptr);  // its function never loaded
}
"""


def _functional(head: int, padded: bool) -> dict:
    return {"Q": "fp16", "BLOCK_DMODEL": str(head), "CAUSAL_TYPE": "0", "ENABLE_DROPOUT": "False",
            "PADDED_HEAD": str(padded), "BIAS_TYPE": "0"}


HELD, LEFT_OUT = _functional(64, False), _functional(64, True)   # head dims 64 and 56


def _manifest(held: dict | None) -> BundleManifest:
    """The manifest check_forced reads, through the model every reader uses: the library and what
    the build left out (one package, LEFT_OUT) and kept (`held`)."""
    reach = {"mode": "dispatched", "proven_by": None, "reason": None, "fused_kernels": 2, "kernels_left_out": 1,
             "packages_left_out": 1, "held": held,
             "left_out": [{"image": "amd-gfx908/flash/bwd_kernel_fuse/x.aks2", "member": None, "kernels": 1,
                           "functional": LEFT_OUT}]}
    return manifest_of({"format": 1, "label": "stand-in", "release": "0.11b", "arch": "gfx908", "hip_major": 6,
                        "spec": {"sha256": "0" * 64}, "library": {"file": LIB},
                        "files": {LIB: {"sha256": "0" * 64, "size": 0}}, "built_with": {"reach": reach}},
                       where="stand-in manifest")


MANIFEST = _manifest(HELD)


@pytest.fixture(scope="module")
def bundle_root(tmp_path_factory, pristine_tree) -> tuple[Path, Path]:
    """An extracted bundle as check_forced reads it: spec.yaml, the release's headers under include/,
    the stand-in library under lib/ and its images packed in lib/aotriton.images; and the cache."""
    root, cache = tmp_path_factory.mktemp("bundle"), tmp_path_factory.mktemp("cache")
    shutil.copy(REPO / "rules" / "examples" / "smoke.yaml", root / "spec.yaml")
    shutil.copytree(pristine_tree("0.11b") / "include" / "aotriton", root / "include" / "aotriton",
                    ignore=shutil.ignore_patterns("*.in"))
    (root / "include" / "aotriton" / "config.h").write_text(   # what the release's CMake writes, in our words
        "#pragma once\n#define AOTRITON_NS aotriton\n#define AOTRITON_API __attribute__((visibility(\"default\")))\n")
    co = root / "co"
    co.mkdir()
    for i, kernel in enumerate(KERNELS):
        image = code_object(AMDGPU_MACH["gfx908"], kernel, kernarg=96 + 8 * i)   # distinct bytes per kernel
        (co / f"{kernel}.co").write_bytes(image)
        pkg = root / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / kernel / "FONLY__.aks2"
        pkg.parent.mkdir(parents=True)
        pkg.write_bytes(aks2({f"{kernel}-Sig-F__hd64": image}))
    stub = build_stub(SYS6.include, SYS6.runtime, cache / "stub")
    (root / "standin.cc").write_text(STANDIN)
    subprocess.run(["g++", "-std=c++20", "-shared", "-fPIC", "-D__HIP_PLATFORM_AMD__", f"-DFUSED_BACKEND={FUSED_BACKEND_INDEX}",
                    f'-DFUSED="{FUSED_FAMILY}"', "-I", str(root / "include"), "-isystem", str(SYS6.include),
                    str(root / "standin.cc"), "-o", str(root / LIB), f"-L{stub.path.parent}", f"-l:{stub.path.name}"],
                   check=True, capture_output=True)
    return root, cache


def _forced(bundle_root, monkeypatch, mode: str = "", fused_heads: str = "64", manifest: BundleManifest = MANIFEST):
    root, cache = bundle_root
    monkeypatch.setenv("MI100_FAKE_IMAGES", str(root / "co"))
    monkeypatch.setenv("MI100_FAKE_MODE", mode)
    monkeypatch.setenv("MI100_FAKE_FUSED", fused_heads)
    rep = CheckReport("stand-in", manifest)
    check_forced(rep, root, manifest, 6, cache, lambda s: None)
    js = rep.as_json()["forced_fused"]
    ClaimRecord.model_validate(js)   # what bundle build records in the manifest: the model takes it
    return rep.forced, js


def test_the_driver_runs_every_case_through_the_library(bundle_root, monkeypatch):
    """check_gpu, then a forward and a backward per case of the smoke spec, each launch named by
    the image the index finds for the bytes the stub was handed."""
    root, cache = bundle_root
    monkeypatch.setenv("MI100_FAKE_IMAGES", str(root / "co"))
    spec = load_spec(root / "spec.yaml").spec
    stub = build_stub(SYS6.include, SYS6.runtime, cache / "stub")
    cases = dispatch_cases(spec)
    r = run_dispatch(lib=root / LIB, prefix=root, images=root / "lib" / "aotriton.images", hip_include=SYS6.include,
                     stub=stub, arch="gfx908", cases=cases, cache=cache / "driver", target=spec.target_string)
    assert r.ok and r.check_gpu == HIP_SUCCESS and r.returncode == 0, (r.summary(), r.stderr_tail)
    assert [c.case for c in r.cases] == [c.name for c in cases] and r.loads == 2 * len(cases)
    assert {tuple(c.kernels["fwd"]) for c in r.cases} == {("amd-gfx908/flash/attn_fwd/FONLY__/attn_fwd-Sig-F__hd64",)}
    assert {tuple(c.kernels["bwd"]) for c in r.cases} == {
        ("amd-gfx908/flash/bwd_kernel_dk_dv/FONLY__/bwd_kernel_dk_dv-Sig-F__hd64",)}
    # the same library on a device of another arch: every code object refused, every case fails
    other = run_dispatch(lib=root / LIB, prefix=root, images=root / "lib" / "aotriton.images",
                         hip_include=SYS6.include, stub=stub, arch="gfx90a", cases=cases[:1], cache=cache / "driver",
                         target=spec.target_string)
    assert not other.ok and other.loads == 0 and other.cases[0].fwd == 209, other.summary()   # hipErrorNoBinaryForGpu


def test_forcing_the_fused_backend_holds(bundle_root, monkeypatch):
    """The held functional launches its fused kernel; the left-out one returns an error, launches
    nothing, and the driver runs on: the claim holds, and its fields say so."""
    claim, js = _forced(bundle_root, monkeypatch)
    seen = js["observed"]
    assert claim.ok and js["ok"], js
    assert seen["driver_exit"] == 0
    assert seen["held"]["functional"] == HELD and seen["held"]["backward"] == HIP_SUCCESS
    assert seen["held"]["fused_launches"] == seen["held"]["launches"] == 1 and seen["held"]["violations"] == []
    lost = seen["left_out"]
    assert lost["functional"] == LEFT_OUT and lost["backward"] == 400             # hipErrorInvalidResourceHandle
    assert lost["launches"] == lost["fused_launches"] == 0
    assert lost["violations"] == [": hipModuleLaunchKernel: NULL function"]


@pytest.mark.parametrize("mode, broken", [
    ("fused-anyway", "left_out"),     # the left-out functional launched a fused kernel
    ("success", "left_out"),          # no error for a backward that cannot have run
    ("crash", "driver"),              # the driver died in the left-out backward
    ("never-fused", "held"),          # the held functional did not launch its fused kernel
])
def test_forcing_the_fused_backend_fails_on_what_happened(bundle_root, monkeypatch, mode, broken):
    claim, js = _forced(bundle_root, monkeypatch, mode)
    seen = js["observed"]
    assert not claim.ok and not js["ok"], js
    if broken == "left_out":
        lost = seen["left_out"]
        assert seen["driver_exit"] == 0 and lost["backward"] == HIP_SUCCESS, lost
        assert lost["fused_launches"] == (1 if mode == "fused-anyway" else 0)
    elif broken == "driver":
        assert seen["driver_exit"] != 0 and seen["left_out"]["backward"] is None, seen
        assert seen["held"]["backward"] == HIP_SUCCESS and seen["held"]["fused_launches"] == 1
    else:
        assert seen["held"]["fused_launches"] == 0 and seen["held"]["backward"] != HIP_SUCCESS, seen["held"]


def test_every_fused_package_left_out_has_no_held_half(bundle_root, monkeypatch):
    manifest = _manifest(None)
    claim, js = _forced(bundle_root, monkeypatch, fused_heads="", manifest=manifest)
    assert claim.ok and js["observed"]["held"] is None and js["observed"]["left_out"]["backward"] == 400, js


def test_coverage_of_the_stand_in_and_of_a_copy_without_its_forward_package(bundle_root, monkeypatch, tmp_path):
    """bundle check's coverage (codegen.ship.coverage) over the stub's log: every declared axis
    dispatched, the three packages the library names packed, the fused one not loaded (the op
    table's choice, said so). A copy without the forward package (and its code object): every case
    fails and the package the library names is missing, by name."""
    root, cache = bundle_root
    spec = load_spec(root / "spec.yaml").spec
    stub = build_stub(SYS6.include, SYS6.runtime, cache / "stub")
    cases = check_cases(spec)

    def run(at: Path):
        monkeypatch.setenv("MI100_FAKE_IMAGES", str(at / "co"))
        r = run_dispatch(lib=at / LIB, prefix=at, images=at / "lib" / "aotriton.images", hip_include=SYS6.include,
                         stub=stub, arch="gfx908", cases=cases, cache=cache / "driver", target=spec.target_string)
        return r, coverage(spec, cases, r, (at / LIB).read_bytes(), "gfx908", list(MANIFEST.built_with.reach.left_out))

    r, cov = run(root)
    assert r.ok and cov.ok, [c.detail for c in cov.claims]
    drivers = sorted(p.name for p in (cache / "driver").glob("driver-*"))
    assert len(cases) > len(dispatch_cases(spec)) and any(c.dtype == "bf16" for c in cases)
    assert cov.packages.named == cov.packages.packed == 3 and cov.packages.loaded == 2
    assert list(cov.packages.not_loaded.values()) == [[f"amd-gfx908/flash/{FUSED_FAMILY}/FONLY__.aks2"]]

    copy = tmp_path / "b"
    shutil.copytree(root, copy)
    (copy / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / "attn_fwd" / "FONLY__.aks2").unlink()
    (copy / "co" / "attn_fwd.co").unlink()
    r, cov = run(copy)
    # the same library in another folder (as bundle check extracts each check anew): the same driver
    assert sorted(p.name for p in (cache / "driver").glob("driver-*")) == drivers
    axes, _ = cov.claims
    assert not r.ok and not cov.ok and not axes.ok
    assert cov.packages.missing == ["amd-gfx908/flash/attn_fwd/FONLY__.aks2"]
    assert all(a.failed == a.cases for a in cov.axes)
