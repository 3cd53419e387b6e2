"""A stand-in AOTriton library that computes attention for real, for the tests of executed dispatch
(tests/test_execute_standin.py): its `attn_fwd` and `attn_bwd` launch naive Triton kernels of ours
(one program per query row or key row; written here, not AOTriton's), compiled for gfx908 by pip
Triton and packed in an images folder as a bundle packs them, through the stub HIP runtime's
kernelParams launches, as the real library launches its kernels. MI100_FAKE_MODE plants a fault:
`scale` (the forward's softmax scale off by 1%), `wild` (an fp16 forward's output pointer 1 MiB
before the arena)."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import triton
import triton.language as tl


@triton.jit
def naive_fwd(Q, K, V, Bias, Out, L, Sq, Sk, D, Hq, Hk, scale, causal, has_bias,
              BN: tl.constexpr, BD: tl.constexpr):
    i = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // (Hq // Hk)
    n = tl.arange(0, BN)
    d = tl.arange(0, BD)
    row = (b * Hq + h) * Sq + i
    q = tl.load(Q + row * D + d, mask=d < D, other=0.0).to(tl.float32)
    kv = ((b * Hk + hk) * Sk + n[:, None]) * D + d[None, :]
    kvm = (n[:, None] < Sk) & (d[None, :] < D)
    s = tl.sum(tl.load(K + kv, mask=kvm, other=0.0).to(tl.float32) * q[None, :], 1) * scale
    if has_bias != 0:
        s += tl.load(Bias + row * Sk + n, mask=n < Sk, other=0.0).to(tl.float32)
    valid = (n < Sk) & ((causal == 0) | (n <= i))
    s = tl.where(valid, s, float("-inf"))
    m = tl.max(s, 0)
    p = tl.exp(s - m)
    lsum = tl.sum(p, 0)
    o = tl.sum(p[:, None] * tl.load(V + kv, mask=kvm, other=0.0).to(tl.float32), 0) / lsum
    tl.store(Out + row * D + d, o.to(Out.dtype.element_ty), mask=d < D)
    tl.store(L + row, m + tl.log(lsum))


@triton.jit
def naive_dkdv(Q, K, V, Bias, Out, DO, L, DK, DV, DB, Sq, Sk, D, Hq, Hk, scale, causal, has_bias,
               BM: tl.constexpr, BD: tl.constexpr):
    j = tl.program_id(0)
    hk = tl.program_id(1)
    b = tl.program_id(2)
    mm = tl.arange(0, BM)
    d = tl.arange(0, BD)
    kvrow = (b * Hk + hk) * Sk + j
    k = tl.load(K + kvrow * D + d, mask=d < D, other=0.0).to(tl.float32)
    v = tl.load(V + kvrow * D + d, mask=d < D, other=0.0).to(tl.float32)
    dk = tl.zeros([BD], tl.float32)
    dv = tl.zeros([BD], tl.float32)
    G = Hq // Hk
    for g in range(0, G):
        h = hk * G + g
        rows = (b * Hq + h) * Sq + mm
        qm = (mm[:, None] < Sq) & (d[None, :] < D)
        off = rows[:, None] * D + d[None, :]
        q = tl.load(Q + off, mask=qm, other=0.0).to(tl.float32)
        do = tl.load(DO + off, mask=qm, other=0.0).to(tl.float32)
        o = tl.load(Out + off, mask=qm, other=0.0).to(tl.float32)
        lse = tl.load(L + rows, mask=mm < Sq, other=0.0)
        s = tl.sum(q * k[None, :], 1) * scale
        if has_bias != 0:
            s += tl.load(Bias + rows * Sk + j, mask=mm < Sq, other=0.0).to(tl.float32)
        valid = (mm < Sq) & ((causal == 0) | (j <= mm))
        p = tl.where(valid, tl.exp(s - lse), 0.0)
        dv += tl.sum(p[:, None] * do, 0)
        ds = p * (tl.sum(do * v[None, :], 1) - tl.sum(do * o, 1))
        dk += tl.sum(ds[:, None] * q, 0) * scale
        if has_bias != 0:
            tl.store(DB + rows * Sk + j, ds.to(DB.dtype.element_ty), mask=mm < Sq)
    tl.store(DK + kvrow * D + d, dk.to(DK.dtype.element_ty), mask=d < D)
    tl.store(DV + kvrow * D + d, dv.to(DV.dtype.element_ty), mask=d < D)


@triton.jit
def naive_dq(Q, K, V, Bias, Out, DO, L, DQ, Sq, Sk, D, Hq, Hk, scale, causal, has_bias,
             BN: tl.constexpr, BD: tl.constexpr):
    i = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // (Hq // Hk)
    n = tl.arange(0, BN)
    d = tl.arange(0, BD)
    row = (b * Hq + h) * Sq + i
    q = tl.load(Q + row * D + d, mask=d < D, other=0.0).to(tl.float32)
    do = tl.load(DO + row * D + d, mask=d < D, other=0.0).to(tl.float32)
    o = tl.load(Out + row * D + d, mask=d < D, other=0.0).to(tl.float32)
    kv = ((b * Hk + hk) * Sk + n[:, None]) * D + d[None, :]
    kvm = (n[:, None] < Sk) & (d[None, :] < D)
    k = tl.load(K + kv, mask=kvm, other=0.0).to(tl.float32)
    s = tl.sum(k * q[None, :], 1) * scale
    if has_bias != 0:
        s += tl.load(Bias + row * Sk + n, mask=n < Sk, other=0.0).to(tl.float32)
    valid = (n < Sk) & ((causal == 0) | (n <= i))
    p = tl.where(valid, tl.exp(s - tl.load(L + row)), 0.0)
    dp = tl.sum(tl.load(V + kv, mask=kvm, other=0.0).to(tl.float32) * do[None, :], 1)
    ds = p * (dp - tl.sum(do * o, 0))
    tl.store(DQ + row * D + d, (tl.sum(ds[:, None] * k, 0) * scale).to(DQ.dtype.element_ty), mask=d < D)


TILE = 16     # BM, BN and BD: the stand-in serves sequence lengths and head dims up to 16
POINTERS = {"naive_fwd": "Q K V Bias Out L", "naive_dkdv": "Q K V Bias Out DO L DK DV DB",
            "naive_dq": "Q K V Bias Out DO L DQ"}


@functools.lru_cache(maxsize=None)
def compile_naive(kernel: str, dtype: str) -> tuple[bytes, str, int]:
    """(code object, kernel name, dynamic LDS bytes) of one naive kernel for gfx908, one warp."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {p: ("*fp32" if p == "L" else f"*{dtype}") for p in POINTERS[kernel].split()}
    sig.update({p: "i32" for p in ("Sq", "Sk", "D", "Hq", "Hk")}, scale="fp32", causal="i32", has_bias="i32")
    const = {"BN" if kernel != "naive_dkdv" else "BM": TILE, "BD": TILE}
    sig.update({c: "constexpr" for c in const})
    # without buffer instructions, as the library's own kernels load 16-bit values (global_load_ushort):
    # the emulator's MUBUF handler moves whole dwords, so a 16-bit buffer load or store is wrong
    with triton.knobs.amd.scope():
        triton.knobs.amd.use_buffer_ops = False
        k = triton.compile(ASTSource(fn=globals()[kernel], signature=sig, constexprs=const),
                           target=GPUTarget("hip", "gfx908", 64), options={"num_warps": 1, "num_stages": 1})
    return k.asm["hsaco"], k.metadata.name, k.metadata.shared


# The stand-in: one code object per kernel and dtype, read from MI100_FAKE_IMAGES/<kernel>-<dtype>.co
# and loaded once; every launch passes kernelParams (a pointer per explicit argument, Triton's two
# scratch pointers null) and the kernel's dynamic LDS (shared.h, from Triton's metadata), as
# AOTriton's TritonKernel::invoke does with its package directory's.
STANDIN = r"""
#include <aotriton/flash.h>
#include "shared.h"  // std::map<std::string, unsigned> SHARED: "<kernel>-<dtype>" -> dynamic LDS bytes
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace ao = AOTRITON_NS;
template class ao::TensorView<1>;
template class ao::TensorView<2>;
template class ao::TensorView<4>;
ao::v3::flash::attn_fwd_params::attn_fwd_params() {}
ao::v3::flash::attn_bwd_params::attn_bwd_params() {}

namespace {
std::string env(const char* n) { const char* v = std::getenv(n); return v ? v : ""; }

std::string key_of(const std::string& kernel, ao::DType t) {
  return kernel + (t == ao::DType::kBFloat16 ? "-bf16" : "-fp16");
}

hipError_t function(const std::string& kernel, ao::DType t, hipFunction_t* fn) {
  static std::map<std::string, hipFunction_t> loaded;
  static std::vector<std::vector<char>> images;
  std::string key = key_of(kernel, t);
  if (loaded.count(key)) { *fn = loaded[key]; return hipSuccess; }
  FILE* f = std::fopen((env("MI100_FAKE_IMAGES") + "/" + key + ".co").c_str(), "rb");
  if (!f) return hipErrorFileNotFound;
  std::vector<char> data;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  images.push_back(data);
  hipModule_t mod;
  hipError_t e = hipModuleLoadDataEx(&mod, images.back().data(), 0, nullptr, nullptr);
  if (e == hipSuccess) e = hipModuleGetFunction(fn, mod, kernel.c_str());
  if (e == hipSuccess) loaded[key] = *fn;
  return e;
}

struct Args {   // what every kernel takes after its pointers
  int sq, sk, d, hq, hk;
  float scale;
  int causal, bias;
};

hipError_t launch(const char* kernel, ao::DType t, unsigned gx, unsigned gy, unsigned gz, std::vector<void*> ptrs, Args& a) {
  hipFunction_t fn;
  hipError_t e = function(kernel, t, &fn);
  if (e != hipSuccess) return e;
  static void* null = nullptr;
  std::vector<void*> params;
  for (void*& p : ptrs) params.push_back(&p);
  for (void* v : {(void*)&a.sq, (void*)&a.sk, (void*)&a.d, (void*)&a.hq, (void*)&a.hk, (void*)&a.scale,
                  (void*)&a.causal, (void*)&a.bias, (void*)&null, (void*)&null})
    params.push_back(v);
  return hipModuleLaunchKernel(fn, gx, gy, gz, 64, 1, 1, SHARED.at(key_of(kernel, t)), nullptr, params.data(), nullptr);
}

Args args_of(const ao::TensorView<4>& q, const ao::TensorView<4>& k, float scale, int8_t causal, bool bias) {
  return Args{int(q.size(2)), int(k.size(2)), int(q.size(3)), int(q.size(1)), int(k.size(1)), scale, causal != 0, bias};
}
}  // namespace

hipError_t ao::v2::flash::check_gpu(ao::Stream) {
  int device = -1;
  return hipGetDevice(&device);
}

hipError_t ao::v3::flash::attn_fwd(const attn_fwd_params& p, int32_t, ao::Stream, const attn_options*) {
  Args a = args_of(p.Q, p.K, p.Sm_scale * (env("MI100_FAKE_MODE") == "scale" ? 1.01f : 1.0f), p.causal_type, bool(p.B));
  bool wild = env("MI100_FAKE_MODE") == "wild" && p.Q.dtype() == ao::DType::kFloat16;
  char* out = static_cast<char*>(p.Out.data_ptr()) - (wild ? (1 << 20) : 0);
  return launch("naive_fwd", p.Q.dtype(), a.sq, a.hq, p.Q.size(0),
                {p.Q.data_ptr(), p.K.data_ptr(), p.V.data_ptr(), p.B.data_ptr(), out, p.L.data_ptr()}, a);
}

hipError_t ao::v3::flash::attn_bwd(const attn_bwd_params& p, int32_t, ao::Stream, const attn_options*) {
  Args a = args_of(p.Q, p.K, p.Sm_scale, p.causal_type, bool(p.B));
  hipError_t e = launch("naive_dkdv", p.Q.dtype(), a.sk, a.hk, p.Q.size(0),
                        {p.Q.data_ptr(), p.K.data_ptr(), p.V.data_ptr(), p.B.data_ptr(), p.Out.data_ptr(),
                         p.DO.data_ptr(), p.L.data_ptr(), p.DK.data_ptr(), p.DV.data_ptr(), p.DB.data_ptr()}, a);
  if (e != hipSuccess) return e;
  return launch("naive_dq", p.Q.dtype(), a.sq, a.hq, p.Q.size(0),
                {p.Q.data_ptr(), p.K.data_ptr(), p.V.data_ptr(), p.B.data_ptr(), p.Out.data_ptr(),
                 p.DO.data_ptr(), p.L.data_ptr(), p.DQ.data_ptr()}, a);
}
"""

LIB = "lib/libaotriton_v2.so.0.11.0"


def build_standin(root: Path, tree: Path, sysroot, stub, aks2) -> Path:
    """An extracted bundle folder as ship.execute reads one: spec.yaml, the release's headers
    under include/, the stand-in under lib/, its code objects in co/ and packed in
    lib/aotriton.images (`aks2`: tests/test_bundle_units.aks2)."""
    repo = Path(__file__).resolve().parents[1]
    shutil.copy(repo / "rules" / "examples" / "smoke.yaml", root / "spec.yaml")
    shutil.copytree(tree / "include" / "aotriton", root / "include" / "aotriton", ignore=shutil.ignore_patterns("*.in"))
    (root / "include" / "aotriton" / "config.h").write_text(
        "#pragma once\n#define AOTRITON_NS aotriton\n#define AOTRITON_API __attribute__((visibility(\"default\")))\n")
    (root / "co").mkdir()
    shared = []
    for kernel in POINTERS:
        for dtype in ("fp16", "bf16"):
            co, name, lds = compile_naive(kernel, dtype)
            assert name == kernel
            (root / "co" / f"{kernel}-{dtype}.co").write_bytes(co)
            shared.append(f'{{"{kernel}-{dtype}", {lds}u}}')
            pkg = root / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / kernel / f"F__{dtype}.aks2"
            pkg.parent.mkdir(parents=True, exist_ok=True)
            pkg.write_bytes(aks2({f"{kernel}-Sig-F__{dtype}": co}))
    (root / "shared.h").write_text("#include <map>\n#include <string>\n"
                                   f"static const std::map<std::string, unsigned> SHARED = {{{', '.join(shared)}}};\n")
    (root / "standin.cc").write_text(STANDIN)
    subprocess.run(["g++", "-std=c++20", "-shared", "-fPIC", "-D__HIP_PLATFORM_AMD__", "-I", str(root),
                    "-I", str(root / "include"),
                    "-isystem", str(sysroot.include), str(root / "standin.cc"), "-o", str(root / LIB),
                    f"-L{stub.path.parent}", f"-l:{stub.path.name}"], check=True, capture_output=True)
    return root / LIB
