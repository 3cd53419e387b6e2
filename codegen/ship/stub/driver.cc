// mi100-codegen's dispatch driver: calls an AOTriton library's own entry points (v2 check_gpu,
// v3 attn_fwd and attn_bwd, the API PyTorch calls) for SDPA cases read from stdin, against the
// stub HIP runtime (hip_stub.c). Tensors are host buffers: the stub validates each code object
// and launch and runs no kernel, so nothing reads them.
//
// Execute mode (codegen/ship/execute.py; MI100_EXEC_ARENA set, and the stub's MI100_STUB_EXEC):
// the arena file is mapped at the address the kernels see (MI100_EXEC_BASE, MI100_EXEC_SIZE) and
// every tensor is allocated in the region MI100_EXEC_REGION ("ADDR,BYTES") of it, zeroed, so the
// pointers the library passes are arena addresses. Per case, after allocating, a CASE frame (JSON:
// each tensor's address, shape, strides, dtype) goes to the parent, which fills the inputs; a
// PHASE frame (fwd, bwd, mask) before each entry point; with dropout, after the backward, the
// library's debug_simulate_encoded_softmax writes the mask its kernels draw (upstream's tests take
// their reference's mask from it); then a DONE frame (JSON: the HIP errors). CASE and DONE wait
// for the parent's 4-byte answer (non-zero: stop).
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

#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace ao = AOTRITON_NS;
using ao::DType;

// weak: a library without it still runs every case that has no dropout to check (address null)
namespace AOTRITON_NS::v2::flash {
decltype(debug_simulate_encoded_softmax) debug_simulate_encoded_softmax __attribute__((weak));
}

namespace {

std::vector<void*> allocations;

// execute mode: the driver's region of the arena, a bump allocator reset after each case
struct Region {
  bool on = false;
  uintptr_t start = 0, end = 0, next = 0;
  int req = -1, rep = -1;
} arena;

uint64_t env_u64(const char* name, int base) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, base) : 0;
}

void fail(const char* what) {
  std::fprintf(stderr, "dispatch driver (execute mode): %s\n", what);
  std::exit(3);
}

void map_arena() {
  const char* path = std::getenv("MI100_EXEC_ARENA");
  if (!path || !*path) return;
  uint64_t base = env_u64("MI100_EXEC_BASE", 16), size = env_u64("MI100_EXEC_SIZE", 10);
  const char* region = std::getenv("MI100_EXEC_REGION");
  const char* fds = std::getenv("MI100_STUB_EXEC");
  unsigned long long start = 0, bytes = 0;
  if (!base || !size || !region || std::sscanf(region, "%llx,%llu", &start, &bytes) != 2 || !fds ||
      std::sscanf(fds, "%d,%d", &arena.req, &arena.rep) != 2)
    fail("MI100_EXEC_BASE, MI100_EXEC_SIZE, MI100_EXEC_REGION and MI100_STUB_EXEC must be set");
  if (start < base || bytes > size || start - base > size - bytes) fail("the region is not inside the arena");
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) fail("cannot open the arena file");
  void* at = mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
  close(fd);
  if (at == MAP_FAILED || at != reinterpret_cast<void*>(base)) fail("cannot map the arena at its device address");
  arena.on = true;
  arena.start = arena.next = start;
  arena.end = start + bytes;
}

void* host(size_t bytes) {
  if (arena.on) {
    uintptr_t p = (arena.next + 255) & ~uintptr_t(255);
    if (p > arena.end || (bytes ? bytes : 1) > arena.end - p) fail("the arena region is full");
    arena.next = p + (bytes ? bytes : 1);
    std::memset(reinterpret_cast<void*>(p), 0, bytes);
    return reinterpret_cast<void*>(p);
  }
  void* p = std::calloc(bytes ? bytes : 1, 1);
  if (!p) {
    std::fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
    std::exit(3);
  }
  allocations.push_back(p);
  return p;
}

void release() {
  for (void* p : allocations) std::free(p);
  allocations.clear();
  arena.next = arena.start;
}

// one frame to the parent: type, length, payload (ask: then its 4-byte answer)
enum : uint32_t { EXEC_CASE = 1, EXEC_DONE = 4, EXEC_PHASE = 5 };
void tell(uint32_t type, const std::string& payload) {
  uint32_t head[2] = {type, static_cast<uint32_t>(payload.size())};
  auto put = [](int fd, const void* p, size_t n) {
    for (auto c = static_cast<const char*>(p); n;) {
      ssize_t w = write(fd, c, n);
      if (w <= 0) return false;
      c += w, n -= size_t(w);
    }
    return true;
  };
  if (!put(arena.req, head, sizeof head) || !put(arena.req, payload.data(), payload.size())) fail("the parent is gone");
}

int32_t ask(uint32_t type, const std::string& payload) {
  int32_t answer = -1;
  tell(type, payload);
  for (auto c = reinterpret_cast<char*>(&answer), e = c + sizeof answer; c < e;) {
    ssize_t r = read(arena.rep, c, size_t(e - c));
    if (r <= 0) fail("the parent is gone");
    c += r;
  }
  return answer;
}

const char* dtype_name(DType t) {
  return t == DType::kFloat32 ? "fp32" : t == DType::kBFloat16 ? "bf16" : t == DType::kFloat16 ? "fp16"
       : t == DType::kUInt64 ? "u64" : t == DType::kInt32 ? "i32" : "?";
}

template <int R>
void describe(std::ostringstream& js, const char* name, const ao::TensorView<R>& t, DType d, bool& first) {
  if (!t.data_ptr()) return;
  js << (first ? "" : ",") << "\"" << name << "\":{\"addr\":" << reinterpret_cast<uintptr_t>(t.data_ptr())
     << ",\"dtype\":\"" << dtype_name(d) << "\",\"shape\":[";
  for (int i = 0; i < R; i++) js << (i ? "," : "") << t.size(i);
  js << "],\"strides\":[";
  for (int i = 0; i < R; i++) js << (i ? "," : "") << t.stride(i);
  js << "]}";
  first = false;
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
  if (arena.on) tell(EXEC_PHASE, phase);
  const char* path = std::getenv("MI100_STUB_LOG");
  FILE* f = path ? std::fopen(path, "a") : nullptr;
  if (!f) return;
  std::fprintf(f, "{\"event\":\"case\",\"case\":\"%s\",\"phase\":\"%s\"}\n", name.c_str(), phase);
  std::fclose(f);
}

}  // namespace

int main() {
  map_arena();
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
    ao::TensorView<4> mask;   // execute mode with dropout: the dropout mask the kernels draw
    if (arena.on && dropout > 0) mask = t4(batch, hq, sq, sk, t);
    if (arena.on) {
      std::ostringstream js;
      bool first = true;
      js << "{\"case\":\"" << name << "\",\"tensors\":{";
      describe(js, "q", fwd.Q, t, first);
      describe(js, "k", fwd.K, t, first);
      describe(js, "v", fwd.V, t, first);
      describe(js, "b", fwd.B, t, first);
      describe(js, "do", bwd.DO, t, first);
      describe(js, "out", fwd.Out, t, first);
      describe(js, "lse", fwd.L, DType::kFloat32, first);
      describe(js, "dq", bwd.DQ, t, first);
      describe(js, "dk", bwd.DK, t, first);
      describe(js, "dv", bwd.DV, t, first);
      describe(js, "db", bwd.DB, t, first);
      describe(js, "mask", mask, t, first);
      describe(js, "philox_seed", fwd.philox_seed_ptr, DType::kUInt64, first);
      describe(js, "philox_offset1", fwd.philox_offset1, DType::kUInt64, first);
      js << "}}";
      if (ask(EXEC_CASE, js.str()) != 0) fail("the parent refused the case");
    }
    marker(name, "fwd");
    hipError_t ef = ao::v3::flash::attn_fwd(fwd, ao::v3::flash::attn_fwd_params::kVersion, ao::Stream(stream));
    marker(name, "bwd");
    ao::v3::flash::attn_options options;
    options.force_backend_index = force;
    hipError_t eb = ao::v3::flash::attn_bwd(bwd, ao::v3::flash::attn_bwd_params::kVersion, ao::Stream(stream),
                                            force >= 0 ? &options : nullptr);
    hipError_t em = hipErrorNotFound;
    if (mask && &ao::v2::flash::debug_simulate_encoded_softmax) {
      marker(name, "mask");
      em = ao::v2::flash::debug_simulate_encoded_softmax(mask, dropout, fwd.philox_seed_ptr, fwd.philox_offset1,
                                                         fwd.philox_offset2, ao::Stream(stream));
    }
    std::ostringstream done;
    done << "{\"case\":\"" << name << "\",\"fwd\":" << static_cast<int>(ef) << ",\"bwd\":" << static_cast<int>(eb);
    if (mask) done << ",\"mask\":" << static_cast<int>(em);
    done << "}";
    if (arena.on && ask(EXEC_DONE, done.str()) != 0) fail("the parent stopped after the case");
    std::printf("%s\n", done.str().c_str());
    std::fflush(stdout);
    release();
  }
  return 0;
}
