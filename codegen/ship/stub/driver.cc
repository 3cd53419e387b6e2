// mi100-codegen's dispatch driver: calls an AOTriton library's own entry points (v2 check_gpu,
// v3 attn_fwd and attn_bwd, the API PyTorch calls) for SDPA cases read from stdin, against the
// stub HIP runtime (hip_stub.c). Tensors are host buffers: the stub validates each code object
// and launch and runs no kernel, so nothing reads them.
//
// Compiled at run time by codegen/ship/dispatch.py against the library's installed headers and
// the HIP headers of its major. One case per stdin line:
//   name dtype head_dim causal batch heads_q heads_k seqlen_q seqlen_k bias dropout [force]
// where `force`, when >= 0, is passed to the backward as attn_options.force_backend_index (the
// library's debugging option that replaces its op table's choice of backend).
// One JSON line per case on stdout; a {"event":"case"} marker goes to the stub's log first, so
// the log's load/launch lines that follow belong to that case.
#include <aotriton/flash.h>
#if __has_include(<aotriton/v2/flash.h>)
#include <aotriton/v2/flash.h>  // 0.11b-0.12.1b declare check_gpu here; 0.13b+ in aotriton/flash.h
#endif

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace ao = AOTRITON_NS;
using ao::DType;

namespace {

std::vector<void*> allocations;

void* host(size_t bytes) {
  void* p = std::calloc(bytes ? bytes : 1, 1);
  if (!p) {
    std::fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
    std::exit(3);
  }
  allocations.push_back(p);
  return p;
}

size_t esize(DType t) { return t == DType::kFloat32 ? 4 : 2; }

ao::TensorView<4> t4(uint64_t a, uint64_t b, uint64_t c, uint64_t d, DType t) {
  void* p = host(a * b * c * d * esize(t));
  return ao::TensorView<4>(reinterpret_cast<intptr_t>(p), {a, b, c, d}, {b * c * d, c * d, d, 1}, t);
}

ao::TensorView<2> t2(uint64_t a, uint64_t b, DType t) {
  void* p = host(a * b * esize(t));
  return ao::TensorView<2>(reinterpret_cast<intptr_t>(p), {a, b}, {b, 1}, t);
}

ao::TensorView<0> t0(DType t) { return ao::TensorView<0>(reinterpret_cast<intptr_t>(host(8)), t); }

struct Lazy2 {
  uint64_t a, b;
};
struct Lazy4 {
  uint64_t a, b, c, d;
};
ao::TensorView<2> acquire2(void* cookie) {
  auto* l = static_cast<Lazy2*>(cookie);
  return t2(l->a, l->b, DType::kFloat32);
}
ao::TensorView<4> acquire4(void* cookie) {
  auto* l = static_cast<Lazy4*>(cookie);
  return t4(l->a, l->b, l->c, l->d, DType::kFloat32);
}
void dispose(void*) {}

// A lazy tensor's callbacks take its cookie (0.11b-0.12.1b) or the LazyTensor itself (0.13b+):
// Bind<decltype(member)>::to<F> adapts F(void* cookie) to whichever the headers declare.
void* cookie_of(void* cookie) { return cookie; }
template <int R>
void* cookie_of(ao::LazyTensor<R>* self) { return self->cookie; }
template <typename P>
struct Bind;
template <typename Ret, typename Arg>
struct Bind<Ret (*)(Arg)> {
  template <Ret (*F)(void*)>
  static Ret to(Arg a) { return F(cookie_of(a)); }
};

void marker(const std::string& name, const char* phase) {
  const char* path = std::getenv("MI100_STUB_LOG");
  FILE* f = path ? std::fopen(path, "a") : nullptr;
  if (!f) return;
  std::fprintf(f, "{\"event\":\"case\",\"case\":\"%s\",\"phase\":\"%s\"}\n", name.c_str(), phase);
  std::fclose(f);
}

}  // namespace

int main() {
  hipStream_t stream = nullptr;
  hipError_t chk = ao::v2::flash::check_gpu(ao::Stream(stream));
  std::printf("{\"check_gpu\":%d}\n", static_cast<int>(chk));
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string name, dtype;
    uint64_t hd, batch, hq, hk, sq, sk;
    int causal, bias;
    float dropout;
    if (!(in >> name >> dtype >> hd >> causal >> batch >> hq >> hk >> sq >> sk >> bias >> dropout)) {
      std::fprintf(stderr, "bad case line: %s\n", line.c_str());
      return 2;
    }
    int force = -1;
    if (!(in >> force)) force = -1;
    DType t = dtype == "fp32" ? DType::kFloat32 : dtype == "bf16" ? DType::kBFloat16 : DType::kFloat16;
    float scale = 1.0f / std::sqrt(static_cast<float>(hd));

    ao::v3::flash::attn_fwd_params fwd;
    fwd.Q = t4(batch, hq, sq, hd, t);
    fwd.K = t4(batch, hk, sk, hd, t);
    fwd.V = t4(batch, hk, sk, hd, t);
    if (bias) fwd.B = t4(batch, hq, sq, sk, t);
    fwd.Sm_scale = scale;
    fwd.L = t2(batch * hq, sq, DType::kFloat32);
    fwd.Out = t4(batch, hq, sq, hd, t);
    fwd.dropout_p = dropout;
    fwd.philox_seed_ptr = t0(DType::kUInt64);
    fwd.philox_offset1 = t0(DType::kUInt64);
    fwd.philox_offset2 = 0;
    fwd.philox_seed_output = t0(DType::kUInt64);
    fwd.philox_offset_output = t0(DType::kUInt64);
    fwd.persistent_atomic_counter = t0(DType::kInt32);
    fwd.causal_type = causal ? ao::v3::flash::CausalType::WindowedAttention : ao::v3::flash::CausalType::None;
    fwd.window_left = ao::v3::flash::WindowValue::TopLeftAligned;
    fwd.window_right = ao::v3::flash::WindowValue::TopLeftAligned;
    marker(name, "fwd");
    hipError_t ef = ao::v3::flash::attn_fwd(fwd, ao::v3::flash::attn_fwd_params::kVersion, ao::Stream(stream));

    ao::v3::flash::attn_bwd_params bwd;
    bwd.Q = fwd.Q;
    bwd.K = fwd.K;
    bwd.V = fwd.V;
    bwd.B = fwd.B;
    bwd.Sm_scale = scale;
    bwd.Out = fwd.Out;
    bwd.DO = t4(batch, hq, sq, hd, t);
    bwd.DK = t4(batch, hk, sk, hd, t);
    bwd.DV = t4(batch, hk, sk, hd, t);
    bwd.DQ = t4(batch, hq, sq, hd, t);
    if (bias) bwd.DB = t4(batch, hq, sq, sk, t);
    bwd.L = fwd.L;
    Lazy2 d{batch * hq, sq};
    Lazy4 acc{batch, hq, sq, hd};
    bwd.D.cookie = &d;
    bwd.D.acquire = Bind<decltype(bwd.D.acquire)>::to<acquire2>;
    bwd.D.dispose = Bind<decltype(bwd.D.dispose)>::to<dispose>;
    bwd.DQ_ACC.cookie = &acc;
    bwd.DQ_ACC.acquire = Bind<decltype(bwd.DQ_ACC.acquire)>::to<acquire4>;
    bwd.DQ_ACC.dispose = Bind<decltype(bwd.DQ_ACC.dispose)>::to<dispose>;
    bwd.dropout_p = dropout;
    bwd.philox_seed_ptr = fwd.philox_seed_ptr;
    bwd.philox_offset1 = fwd.philox_offset1;
    bwd.philox_offset2 = 0;
    bwd.causal_type = fwd.causal_type;
    bwd.window_left = fwd.window_left;
    bwd.window_right = fwd.window_right;
    marker(name, "bwd");
    ao::v3::flash::attn_options options;
    options.force_backend_index = force;
    hipError_t eb = ao::v3::flash::attn_bwd(bwd, ao::v3::flash::attn_bwd_params::kVersion, ao::Stream(stream),
                                            force >= 0 ? &options : nullptr);
    std::printf("{\"case\":\"%s\",\"fwd\":%d,\"bwd\":%d}\n", name.c_str(), static_cast<int>(ef), static_cast<int>(eb));
    std::fflush(stdout);
    for (void* p : allocations) std::free(p);
    allocations.clear();
  }
  return 0;
}
