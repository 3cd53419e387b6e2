/* mi100-codegen's stub HIP runtime: the few HIP functions AOTriton's runtime calls, on a CPU.
 *
 * It reports one device of the target the driver names, checks every code object the library
 * hands it and every launch it asks for, logs each event as a JSON line, and runs no kernel. A
 * violation is logged as {"event":"violation",...}, printed to stderr and returned as a HIP error.
 *
 * Built at run time by codegen/ship/stub.py with the system's C compiler against the HIP
 * headers of the major it stands in for (so hipDeviceProp_t is that major's real struct), with
 * SONAME libamdhip64.so.<major> and the symbol versions the real runtime of that major gives
 * these functions (a version script written from the real library's .gnu.version_d).
 *
 * Environment (set by the driver):
 *   MI100_STUB_TARGET  device target, e.g. "gfx908:sramecc+:xnack-"   (required)
 *   MI100_STUB_MACH    EF_AMDGPU_MACH value code objects must carry    (required, decimal)
 *   MI100_STUB_WAVE    wavefront size of the device (64, or 32 on RDNA) (default 64)
 *   MI100_STUB_CUS     compute units reported (default 120)
 *   MI100_STUB_LOG     file the JSON lines are appended to (default: stderr)
 *   MI100_STUB_EXEC    "REQ,REP": execute mode (codegen/ship/execute.py). Each loaded code object
 *                      is sent on file descriptor REQ, and each valid launch with its explicit
 *                      kernel arguments laid out as the code object's metadata places them; the
 *                      launch waits for the 4-byte answer on REP (0, or the HIP error it returns),
 *                      so the kernels run, one at a time, in the library's order. Frames: a u32
 *                      type (EXEC_LOAD 2, EXEC_LAUNCH 3), a u32 length, the payload.
 */
#include <hip/hip_runtime_api.h>
#if HIP_VERSION_MAJOR >= 6
#include <hip/hip_deprecated.h>
#endif
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static hipError_t last_error = hipSuccess;
static FILE *log_file;

/* --- logging -------------------------------------------------------------------------------- */
static FILE *out(void) {
  if (!log_file) {
    const char *p = getenv("MI100_STUB_LOG");
    log_file = p && *p ? fopen(p, "a") : NULL;
    if (!log_file) log_file = stderr;
  }
  return log_file;
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static hipError_t violation(hipError_t err, const char *kernel, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  FILE *f = out();
  fprintf(f, "{\"event\":\"violation\",\"error\":%d,\"kernel\":", (int)err);
  json_str(f, kernel ? kernel : "");
  fprintf(f, ",\"what\":");
  json_str(f, msg);
  fprintf(f, "}\n");
  fflush(f);
  if (f != stderr) fprintf(stderr, "mi100-codegen HIP stub: violation: %s (%s)\n", msg, kernel ? kernel : "");
  last_error = err;
  return err;
}


/* --- execute mode: the channel to the parent (MI100_STUB_EXEC) -------------------------------- */
enum { EXEC_LOAD = 2, EXEC_LAUNCH = 3 };
static int exec_req = -2, exec_rep = -2;   /* -2: not read yet; -1: not in execute mode */

static int exec_on(void) {
  if (exec_req == -2) {
    const char *v = getenv("MI100_STUB_EXEC");
    int a = -1, b = -1;
    char tail;
    if (v && *v && sscanf(v, "%d,%d%c", &a, &b, &tail) == 2 && a > 2 && b > 2) {
      exec_req = a;
      exec_rep = b;
    } else {
      exec_req = exec_rep = -1;
    }
  }
  return exec_req >= 0;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w <= 0) return 0;
    c += w;
    n -= (size_t)w;
  }
  return 1;
}

static int read_all(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r <= 0) return 0;
    c += r;
    n -= (size_t)r;
  }
  return 1;
}

/* one frame: type, length, then the parts' bytes */
static int exec_send(uint32_t type, const void *const *parts, const size_t *lens, int n) {
  uint64_t total = 0;
  for (int i = 0; i < n; i++) total += lens[i];
  if (total > 0xffffffffu) return 0;
  uint32_t head[2] = {type, (uint32_t)total};
  if (!write_all(exec_req, head, sizeof head)) return 0;
  for (int i = 0; i < n; i++)
    if (!write_all(exec_req, parts[i], lens[i])) return 0;
  return 1;
}

/* --- the device ------------------------------------------------------------------------------- */
static const char *target(void) {
  const char *t = getenv("MI100_STUB_TARGET");
  return t && *t ? t : NULL;
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

/* the device's setting of a target feature: '+', '-', or 0 when the target string lacks it */
static char feature(const char *name) {
  const char *t = target();
  size_t n = strlen(name);
  for (const char *p = t ? strchr(t, ':') : NULL; p; p = strchr(p + 1, ':'))
    if (strncmp(p + 1, name, n) == 0 && (p[1 + n] == '+' || p[1 + n] == '-')) return p[1 + n];
  return 0;
}

#define FILL_PROPS(prop)                                                                     \
  do {                                                                                       \
    memset((prop), 0, sizeof *(prop));                                                       \
    snprintf((prop)->name, sizeof (prop)->name, "mi100-codegen stub (%s)", target());         \
    snprintf((prop)->gcnArchName, sizeof (prop)->gcnArchName, "%s", target());              \
    (prop)->multiProcessorCount = env_int("MI100_STUB_CUS", 120);                           \
    (prop)->warpSize = env_int("MI100_STUB_WAVE", 64);                                       \
    (prop)->maxThreadsPerBlock = 1024;                                                       \
    (prop)->sharedMemPerBlock = 65536;                                                       \
    (prop)->totalGlobalMem = (size_t)32 << 30;                                               \
    (prop)->major = 9;                                                                       \
  } while (0)

static hipError_t check_device(int device) {
  if (!target()) return violation(hipErrorNoDevice, NULL, "MI100_STUB_TARGET is not set");
  if (device != 0) return violation(hipErrorInvalidDevice, NULL, "device %d asked for; the stub has device 0 only", device);
  return hipSuccess;
}

EXPORT hipError_t hipGetDevice(int *device) {
  if (!device) return violation(hipErrorInvalidValue, NULL, "hipGetDevice(NULL)");
  *device = 0;
  return check_device(0);
}

EXPORT hipError_t hipGetDeviceCount(int *count) {
  if (!count) return violation(hipErrorInvalidValue, NULL, "hipGetDeviceCount(NULL)");
  *count = target() ? 1 : 0;
  return hipSuccess;
}

EXPORT hipError_t hipStreamGetDevice(hipStream_t stream, hipDevice_t *device) {
  (void)stream;
  if (!device) return violation(hipErrorInvalidValue, NULL, "hipStreamGetDevice(stream, NULL)");
  *device = 0;
  return check_device(0);
}

#if HIP_VERSION_MAJOR >= 6
/* HIP >= 6 headers map hipGetDeviceProperties to this name (the 6.0 struct) */
EXPORT hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_t *prop, int device) {
  hipError_t e = check_device(device);
  if (e != hipSuccess) return e;
  if (!prop) return violation(hipErrorInvalidValue, NULL, "hipGetDeviceProperties(NULL)");
  FILL_PROPS(prop);
  return hipSuccess;
}
/* the old name keeps the pre-6.0 struct, as the real runtime does */
hipError_t stub_props_r0000(hipDeviceProp_tR0000 *prop, int device) __asm__("hipGetDeviceProperties");
EXPORT hipError_t stub_props_r0000(hipDeviceProp_tR0000 *prop, int device) {
  hipError_t e = check_device(device);
  if (e != hipSuccess) return e;
  if (!prop) return violation(hipErrorInvalidValue, NULL, "hipGetDeviceProperties(NULL)");
  FILL_PROPS(prop);
  return hipSuccess;
}
#else
EXPORT hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int device) {
  hipError_t e = check_device(device);
  if (e != hipSuccess) return e;
  if (!prop) return violation(hipErrorInvalidValue, NULL, "hipGetDeviceProperties(NULL)");
  FILL_PROPS(prop);
  return hipSuccess;
}
#endif

EXPORT hipError_t hipPeekAtLastError(void) { return last_error; }

EXPORT hipError_t hipGetLastError(void) {
  hipError_t e = last_error;
  last_error = hipSuccess;
  return e;
}

/* --- code objects ----------------------------------------------------------------------------- */
typedef struct {
  const unsigned char *p;
  size_t n;
} span;

static int rd(span s, size_t off, size_t len, void *dst) {
  if (off > s.n || len > s.n - off) return 0;
  memcpy(dst, s.p + off, len);
  return 1;
}

/* a bounded msgpack reader: only what the AMDGPU metadata uses */
typedef struct {
  span s;
  size_t pos;
  int ok;
} mp;

static uint64_t mp_be(mp *m, int n) {
  uint64_t v = 0;
  if (m->pos > m->s.n || (size_t)n > m->s.n - m->pos) { m->ok = 0; return 0; }
  for (int i = 0; i < n; i++) v = (v << 8) | m->s.p[m->pos + i];
  m->pos += n;
  return v;
}

enum { MP_NIL, MP_INT, MP_STR, MP_ARR, MP_MAP, MP_OTHER };
typedef struct {
  int kind;
  int64_t i;
  const char *str;
  size_t len;   /* string length, or element count of an array/map */
} mpv;

static mpv mp_next(mp *m) {
  mpv v = {MP_OTHER, 0, NULL, 0};
  uint64_t b = mp_be(m, 1);
  if (!m->ok) return v;
  if (b <= 0x7f) { v.kind = MP_INT; v.i = (int64_t)b; }
  else if (b >= 0xe0) { v.kind = MP_INT; v.i = (int8_t)b; }
  else if ((b & 0xf0) == 0x80) { v.kind = MP_MAP; v.len = b & 0x0f; }
  else if ((b & 0xf0) == 0x90) { v.kind = MP_ARR; v.len = b & 0x0f; }
  else if ((b & 0xe0) == 0xa0) { v.kind = MP_STR; v.len = b & 0x1f; }
  else switch (b) {
    case 0xc0: v.kind = MP_NIL; break;
    case 0xc2: case 0xc3: v.kind = MP_INT; v.i = b == 0xc3; break;
    case 0xcc: v.kind = MP_INT; v.i = (int64_t)mp_be(m, 1); break;
    case 0xcd: v.kind = MP_INT; v.i = (int64_t)mp_be(m, 2); break;
    case 0xce: v.kind = MP_INT; v.i = (int64_t)mp_be(m, 4); break;
    case 0xcf: v.kind = MP_INT; v.i = (int64_t)mp_be(m, 8); break;
    case 0xd0: v.kind = MP_INT; v.i = (int8_t)mp_be(m, 1); break;
    case 0xd1: v.kind = MP_INT; v.i = (int16_t)mp_be(m, 2); break;
    case 0xd2: v.kind = MP_INT; v.i = (int32_t)mp_be(m, 4); break;
    case 0xd3: v.kind = MP_INT; v.i = (int64_t)mp_be(m, 8); break;
    case 0xca: mp_be(m, 4); break;
    case 0xcb: mp_be(m, 8); break;
    case 0xd9: case 0xc4: v.kind = MP_STR; v.len = mp_be(m, 1); break;
    case 0xda: case 0xc5: v.kind = MP_STR; v.len = mp_be(m, 2); break;
    case 0xdb: case 0xc6: v.kind = MP_STR; v.len = mp_be(m, 4); break;
    case 0xdc: v.kind = MP_ARR; v.len = mp_be(m, 2); break;
    case 0xdd: v.kind = MP_ARR; v.len = mp_be(m, 4); break;
    case 0xde: v.kind = MP_MAP; v.len = mp_be(m, 2); break;
    case 0xdf: v.kind = MP_MAP; v.len = mp_be(m, 4); break;
    default: m->ok = 0;
  }
  if (m->ok && v.kind == MP_STR) {
    if (v.len > m->s.n - m->pos) { m->ok = 0; return v; }
    v.str = (const char *)m->s.p + m->pos;
    m->pos += v.len;
  }
  return v;
}

static void mp_skip(mp *m, mpv v, int depth) {
  if (depth > 32) { m->ok = 0; return; }
  size_t n = v.kind == MP_ARR ? v.len : v.kind == MP_MAP ? 2 * v.len : 0;
  for (size_t i = 0; i < n && m->ok; i++) mp_skip(m, mp_next(m), depth + 1);
}

static int mp_is(mpv v, const char *s) {
  return v.kind == MP_STR && v.len == strlen(s) && memcmp(v.str, s, v.len) == 0;
}

#define MAX_ARGS 256   /* explicit arguments placed for execute mode (AOTriton's kernels take < 100) */

typedef struct {
  int found;
  int64_t kernarg_segment_size, max_flat_workgroup_size, wavefront_size;
  int64_t explicit_args, explicit_bytes;   /* non-hidden .args: count, end of the last one */
  int32_t arg_offset[MAX_ARGS], arg_size[MAX_ARGS];   /* of the first MAX_ARGS explicit ones, in order */
} kmeta;

/* the amdhsa.kernels entry of `name` in a metadata note */
static void meta_for(span desc, const char *name, kmeta *k) {
  mp m = {desc, 0, 1};
  mpv top = mp_next(&m);
  if (top.kind != MP_MAP) return;
  for (size_t i = 0; i < top.len && m.ok; i++) {
    mpv key = mp_next(&m), val = mp_next(&m);
    if (!mp_is(key, "amdhsa.kernels") || val.kind != MP_ARR) { mp_skip(&m, val, 0); continue; }
    for (size_t j = 0; j < val.len && m.ok; j++) {
      mpv km = mp_next(&m);
      if (km.kind != MP_MAP) { mp_skip(&m, km, 0); continue; }
      kmeta cur = {0, -1, -1, -1, 0, 0, {0}, {0}};
      int match = 0;
      for (size_t f = 0; f < km.len && m.ok; f++) {
        mpv fk = mp_next(&m), fv = mp_next(&m);
        if (mp_is(fk, ".name") && fv.kind == MP_STR) match = fv.len == strlen(name) && !memcmp(fv.str, name, fv.len);
        else if (mp_is(fk, ".kernarg_segment_size") && fv.kind == MP_INT) cur.kernarg_segment_size = fv.i;
        else if (mp_is(fk, ".max_flat_workgroup_size") && fv.kind == MP_INT) cur.max_flat_workgroup_size = fv.i;
        else if (mp_is(fk, ".wavefront_size") && fv.kind == MP_INT) cur.wavefront_size = fv.i;
        else if (mp_is(fk, ".args") && fv.kind == MP_ARR) {
          for (size_t a = 0; a < fv.len && m.ok; a++) {
            mpv am = mp_next(&m);
            if (am.kind != MP_MAP) { mp_skip(&m, am, 0); continue; }
            int64_t off = -1, size = -1;
            int hidden = 0;
            for (size_t q = 0; q < am.len && m.ok; q++) {
              mpv ak = mp_next(&m), av = mp_next(&m);
              if (mp_is(ak, ".offset") && av.kind == MP_INT) off = av.i;
              else if (mp_is(ak, ".size") && av.kind == MP_INT) size = av.i;
              else if (mp_is(ak, ".value_kind") && av.kind == MP_STR) hidden = av.len >= 7 && !memcmp(av.str, "hidden_", 7);
              else mp_skip(&m, av, 0);
            }
            if (!hidden && off >= 0 && size >= 0) {
              if (cur.explicit_args < MAX_ARGS && off < (1 << 20) && size < (1 << 20)) {
                cur.arg_offset[cur.explicit_args] = (int32_t)off;
                cur.arg_size[cur.explicit_args] = (int32_t)size;
              }
              cur.explicit_args++;
              if (off + size > cur.explicit_bytes) cur.explicit_bytes = off + size;
            }
          }
        } else mp_skip(&m, fv, 0);
      }
      if (match) { cur.found = 1; *k = cur; }
    }
  }
}

typedef struct {
  span img;
  uint64_t hash;
  char target[96];
} module_t;

typedef struct {
  module_t *mod;
  char name[256];
  kmeta meta;
  uint32_t kd_kernarg_size;
} function_t;

/* the end of an ELF64 image: its section header table or its last section, whichever ends later */
static size_t elf_size(const unsigned char *p) {
  uint64_t shoff, phoff;
  uint16_t shentsize, shnum, phentsize, phnum;
  memcpy(&phoff, p + 0x20, 8);
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&phentsize, p + 0x36, 2);
  memcpy(&phnum, p + 0x38, 2);
  memcpy(&shentsize, p + 0x3a, 2);
  memcpy(&shnum, p + 0x3c, 2);
  size_t end = shoff + (size_t)shentsize * shnum;
  if (phoff + (size_t)phentsize * phnum > end) end = phoff + (size_t)phentsize * phnum;
  if (end > ((size_t)1 << 30)) return 0;
  for (unsigned i = 0; i < shnum; i++) {
    const unsigned char *sh = p + shoff + (size_t)i * shentsize;
    uint32_t type;
    uint64_t off, size;
    memcpy(&type, sh + 4, 4);
    memcpy(&off, sh + 0x18, 8);
    memcpy(&size, sh + 0x20, 8);
    if (type != 8 /* NOBITS */ && off + size > end && off + size < ((size_t)1 << 30)) end = off + size;
  }
  return end;
}

static uint64_t fnv1a(span s) {
  uint64_t h = 14695981039346656037ULL; /* FNV-1a 64 offset basis */
  for (size_t i = 0; i < s.n; i++) { h ^= s.p[i]; h *= 1099511628211ULL; }
  return h;
}

static const char *feat_name(uint32_t v) {
  return v == 0 ? "unsupported" : v == 1 ? "any" : v == 2 ? "off" : "on";
}

EXPORT hipError_t hipModuleLoadDataEx(hipModule_t *module, const void *image, unsigned int numOptions,
                                      hipJitOption *options, void **optionValues) {
  (void)numOptions; (void)options; (void)optionValues;
  if (!module || !image) return violation(hipErrorInvalidValue, NULL, "hipModuleLoadDataEx: NULL module or image");
  hipError_t e = check_device(0);
  if (e != hipSuccess) return e;
  const unsigned char *p = image;
  if (memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2 || p[5] != 1)
    return violation(hipErrorInvalidImage, NULL, "hipModuleLoadDataEx: the image is not an ELF64 little-endian file");
  uint16_t machine;
  uint32_t flags;
  memcpy(&machine, p + 0x12, 2);
  memcpy(&flags, p + 0x30, 4);
  if (machine != 224)
    return violation(hipErrorInvalidImage, NULL, "code object e_machine %u, not EM_AMDGPU (224)", machine);
  int mach = flags & 0xff, want = env_int("MI100_STUB_MACH", -1);
  if (mach != want)
    return violation(hipErrorNoBinaryForGpu, NULL, "code object for EF_AMDGPU_MACH 0x%x, the device %s is 0x%x",
                     mach, target(), want);
  /* code object v4+ target features: 0 unsupported, 1 any, 2 off, 3 on */
  uint32_t xnack = (flags >> 8) & 3, sramecc = (flags >> 10) & 3;
  char dx = feature("xnack"), ds = feature("sramecc");
  if ((xnack >= 2 && (dx == 0 || (xnack == 3) != (dx == '+'))) || (sramecc >= 2 && (ds == 0 || (sramecc == 3) != (ds == '+'))))
    return violation(hipErrorNoBinaryForGpu, NULL, "code object xnack %s sramecc %s does not fit the device %s",
                     feat_name(xnack), feat_name(sramecc), target());
  size_t n = elf_size(p);
  if (n < 64) return violation(hipErrorInvalidImage, NULL, "hipModuleLoadDataEx: unreadable ELF header");
  module_t *m = calloc(1, sizeof *m);
  if (!m) return hipErrorOutOfMemory;
  m->img.p = p;
  m->img.n = n;
  m->hash = fnv1a(m->img);
  snprintf(m->target, sizeof m->target, "mach 0x%x xnack %s sramecc %s", mach, feat_name(xnack), feat_name(sramecc));
  FILE *f = out();
  fprintf(f, "{\"event\":\"load\",\"module\":\"%p\",\"bytes\":%zu,\"fnv1a64\":\"%016llx\",\"code_object\":", (void *)m, n,
          (unsigned long long)m->hash);
  json_str(f, m->target);
  fprintf(f, "}\n");
  fflush(f);
  if (exec_on()) {   /* the parent keeps the image: the library may free its copy after the load */
    const void *parts[] = {&m->hash, p};
    size_t lens[] = {sizeof m->hash, n};
    if (!exec_send(EXEC_LOAD, parts, lens, 2)) {
      free(m);
      return violation(hipErrorInvalidImage, NULL, "execute mode: the parent does not take the code object");
    }
  }
  *module = (hipModule_t)m;
  return hipSuccess;
}

/* a section of the module by type (SHT_SYMTAB 2, SHT_DYNSYM 11, SHT_NOTE 7): walk them all */
typedef int (*section_fn)(span img, uint32_t type, uint64_t off, uint64_t size, uint32_t link, uint64_t entsize, void *ctx);

static int each_section(span img, section_fn fn, void *ctx) {
  uint64_t shoff;
  uint16_t shentsize, shnum;
  if (!rd(img, 0x28, 8, &shoff) || !rd(img, 0x3a, 2, &shentsize) || !rd(img, 0x3c, 2, &shnum)) return 0;
  for (unsigned i = 0; i < shnum; i++) {
    unsigned char sh[64];
    if (shentsize < 64 || !rd(img, shoff + (uint64_t)i * shentsize, 64, sh)) return 0;
    uint32_t type, link;
    uint64_t off, size, entsize;
    memcpy(&type, sh + 4, 4);
    memcpy(&off, sh + 0x18, 8);
    memcpy(&size, sh + 0x20, 8);
    memcpy(&link, sh + 0x28, 4);
    memcpy(&entsize, sh + 0x38, 8);
    if (fn(img, type, off, size, link, entsize, ctx)) return 1;
  }
  return 0;
}

typedef struct {
  const char *name;
  int has_func, has_kd;
  uint64_t kd_value;
  int kd_shndx;
} symq;

static int section_offset(span img, int index, uint64_t *addr, uint64_t *off) {
  uint64_t shoff;
  uint16_t shentsize;
  unsigned char sh[64];
  if (!rd(img, 0x28, 8, &shoff) || !rd(img, 0x3a, 2, &shentsize) || shentsize < 64) return 0;
  if (!rd(img, shoff + (uint64_t)index * shentsize, 64, sh)) return 0;
  memcpy(addr, sh + 0x10, 8);
  memcpy(off, sh + 0x18, 8);
  return 1;
}

static int find_symbols(span img, uint32_t type, uint64_t off, uint64_t size, uint32_t link, uint64_t entsize, void *ctx) {
  symq *q = ctx;
  if ((type != 2 && type != 11) || entsize != 24) return 0;
  uint64_t stroff, straddr;
  if (!section_offset(img, link, &straddr, &stroff)) return 0;
  size_t nlen = strlen(q->name);
  for (uint64_t s = 0; s + 24 <= size; s += 24) {
    unsigned char sym[24];
    if (!rd(img, off + s, 24, sym)) return 0;
    uint32_t nm;
    uint16_t shndx;
    uint64_t value;
    memcpy(&nm, sym, 4);
    memcpy(&shndx, sym + 6, 2);
    memcpy(&value, sym + 8, 8);
    if (shndx == 0) continue;
    char buf[300];
    size_t i = 0;
    while (i + 1 < sizeof buf && rd(img, stroff + nm + i, 1, buf + i) && buf[i]) i++;
    buf[i] = 0;
    if (i == nlen && memcmp(buf, q->name, nlen) == 0 && (sym[4] & 0xf) == 2 /* STT_FUNC */) q->has_func = 1;
    if (i == nlen + 3 && memcmp(buf, q->name, nlen) == 0 && memcmp(buf + nlen, ".kd", 3) == 0) {
      q->has_kd = 1;
      q->kd_value = value;
      q->kd_shndx = shndx;
    }
  }
  return 0;
}

typedef struct {
  const char *name;
  kmeta *meta;
} noteq;

static int find_note(span img, uint32_t type, uint64_t off, uint64_t size, uint32_t link, uint64_t entsize, void *ctx) {
  (void)link; (void)entsize;
  noteq *q = ctx;
  if (type != 7) return 0;
  for (uint64_t pos = 0; pos + 12 <= size;) {
    uint32_t namesz, descsz, ntype;
    if (!rd(img, off + pos, 4, &namesz) || !rd(img, off + pos + 4, 4, &descsz) || !rd(img, off + pos + 8, 4, &ntype)) return 0;
    uint64_t name_off = off + pos + 12, desc_off = name_off + ((namesz + 3) & ~3u);
    if (desc_off + descsz > img.n) return 0;
    if (ntype == 32 && namesz == 7 && memcmp(img.p + name_off, "AMDGPU", 7) == 0) {
      span d = {img.p + desc_off, descsz};
      meta_for(d, q->name, q->meta);
      if (q->meta->found) return 1;
    }
    pos = desc_off - off + ((descsz + 3) & ~3u);
  }
  return 0;
}

EXPORT hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module, const char *kname) {
  module_t *m = (module_t *)module;
  if (!function || !m || !kname) return violation(hipErrorInvalidValue, kname, "hipModuleGetFunction: NULL argument");
  if (strlen(kname) >= sizeof(((function_t *)0)->name))
    return violation(hipErrorInvalidValue, kname, "kernel name longer than 255 bytes");
  symq q = {kname, 0, 0, 0, 0};
  each_section(m->img, find_symbols, &q);
  if (!q.has_func || !q.has_kd)
    return violation(hipErrorNotFound, kname, "kernel %s not in the code object (function symbol %s, descriptor %s)",
                     kname, q.has_func ? "present" : "missing", q.has_kd ? "present" : "missing");
  function_t *fn = calloc(1, sizeof *fn);
  if (!fn) return hipErrorOutOfMemory;
  fn->mod = m;
  snprintf(fn->name, sizeof fn->name, "%s", kname);
  noteq nq = {kname, &fn->meta};
  each_section(m->img, find_note, &nq);
  if (!fn->meta.found) {
    free(fn);
    return violation(hipErrorInvalidImage, kname, "no AMDGPU metadata (amdhsa.kernels) entry for the kernel");
  }
  /* the kernel descriptor (64 bytes at <name>.kd): kernarg_size at byte 8 */
  uint64_t addr, off;
  if (!section_offset(m->img, q.kd_shndx, &addr, &off) || !rd(m->img, off + (q.kd_value - addr) + 8, 4, &fn->kd_kernarg_size)) {
    free(fn);
    return violation(hipErrorInvalidImage, kname, "unreadable kernel descriptor");
  }
  if ((int64_t)fn->kd_kernarg_size != fn->meta.kernarg_segment_size) {
    hipError_t err = violation(hipErrorInvalidImage, kname, "kernel descriptor kernarg_size %u != metadata .kernarg_segment_size %lld",
                               fn->kd_kernarg_size, (long long)fn->meta.kernarg_segment_size);
    free(fn);
    return err;
  }
  if (fn->meta.wavefront_size != env_int("MI100_STUB_WAVE", 64)) {
    hipError_t err = violation(hipErrorNoBinaryForGpu, kname, "kernel wavefront size %lld, the device runs %d",
                               (long long)fn->meta.wavefront_size, env_int("MI100_STUB_WAVE", 64));
    free(fn);
    return err;
  }
  FILE *f = out();
  fprintf(f, "{\"event\":\"function\",\"module\":\"%p\",\"fnv1a64\":\"%016llx\",\"kernel\":", (void *)m,
          (unsigned long long)m->hash);
  json_str(f, kname);
  fprintf(f, ",\"kernarg_segment_size\":%lld,\"explicit_args\":%lld,\"explicit_bytes\":%lld,\"max_flat_workgroup_size\":%lld,\"wavefront_size\":%lld}\n",
          (long long)fn->meta.kernarg_segment_size, (long long)fn->meta.explicit_args, (long long)fn->meta.explicit_bytes,
          (long long)fn->meta.max_flat_workgroup_size, (long long)fn->meta.wavefront_size);
  fflush(f);
  *function = (hipFunction_t)fn;
  return hipSuccess;
}

/* execute mode: the launch (checked above) goes to the parent with its explicit kernel arguments
   as HIP lays them out (the `extra` buffer as passed; kernelParams placed at the metadata's
   offsets), and returns what the parent answers */
static hipError_t execute(function_t *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared, void **kernelParams, void **extra) {
  const char *k = fn->name;
  unsigned char *args;
  size_t nargs;
  if (extra) {
    void *buf = NULL;
    size_t *size = NULL;
    for (int i = 0; i < 16 && extra[i] != HIP_LAUNCH_PARAM_END; i++) {
      if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[++i];
      else if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_SIZE) size = (size_t *)extra[++i];
    }
    nargs = *size;
    args = malloc(nargs ? nargs : 1);
    if (!args) return hipErrorOutOfMemory;
    memcpy(args, buf, nargs);
  } else {
    if (fn->meta.explicit_args > MAX_ARGS)
      return violation(hipErrorInvalidValue, k, "execute mode: %lld explicit arguments, more than the %d placed",
                       (long long)fn->meta.explicit_args, MAX_ARGS);
    nargs = (size_t)fn->meta.explicit_bytes;
    args = calloc(nargs ? nargs : 1, 1);
    if (!args) return hipErrorOutOfMemory;
    for (long long i = 0; i < fn->meta.explicit_args; i++)
      memcpy(args + fn->meta.arg_offset[i], kernelParams[i], (size_t)fn->meta.arg_size[i]);
  }
  uint32_t name_len = (uint32_t)strlen(k), dims[7] = {gx, gy, gz, bx, by, bz, shared}, arg_len = (uint32_t)nargs;
  const void *parts[] = {&fn->mod->hash, &name_len, k, dims, &arg_len, args};
  size_t lens[] = {sizeof fn->mod->hash, sizeof name_len, name_len, sizeof dims, sizeof arg_len, nargs};
  int sent = exec_send(EXEC_LAUNCH, parts, lens, 6);
  free(args);
  int32_t answer;
  if (!sent || !read_all(exec_rep, &answer, sizeof answer))
    return violation(hipErrorLaunchFailure, k, "execute mode: no answer from the parent for the launch");
  if (answer != 0) last_error = (hipError_t)answer;
  return (hipError_t)answer;
}

EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz,
                                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                                        hipStream_t stream, void **kernelParams, void **extra) {
  (void)stream;
  function_t *fn = (function_t *)f;
  if (!fn) return violation(hipErrorInvalidResourceHandle, NULL, "hipModuleLaunchKernel: NULL function");
  const char *k = fn->name;
  unsigned long long threads = (unsigned long long)bx * by * bz;
  if (!gx || !gy || !gz) return violation(hipErrorInvalidConfiguration, k, "empty grid %ux%ux%u", gx, gy, gz);
  if (!threads || threads > (unsigned long long)fn->meta.max_flat_workgroup_size)
    return violation(hipErrorInvalidConfiguration, k, "block %ux%ux%u = %llu threads, the kernel allows 1..%lld",
                     bx, by, bz, threads, (long long)fn->meta.max_flat_workgroup_size);
  if (threads % (unsigned long long)fn->meta.wavefront_size)
    return violation(hipErrorInvalidConfiguration, k, "block of %llu threads is not a multiple of the wave size %lld",
                     threads, (long long)fn->meta.wavefront_size);
  if (shared > 65536) return violation(hipErrorInvalidConfiguration, k, "%u bytes of dynamic LDS asked for, 65536 exist", shared);
  long long passed = -1;
  const char *style;
  if (extra) {
    void *buf = NULL;
    size_t *size = NULL;
    int end = 0;
    for (int i = 0; i < 16 && !end; i++) {
      if (extra[i] == HIP_LAUNCH_PARAM_END) end = 1;
      else if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[++i];
      else if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_SIZE) size = (size_t *)extra[++i];
      else return violation(hipErrorInvalidValue, k, "unknown launch parameter tag %p in extra", extra[i]);
    }
    if (!end || !buf || !size) return violation(hipErrorInvalidValue, k, "extra without buffer, size or END");
    passed = (long long)*size;
    style = "buffer";
    if (passed < fn->meta.explicit_bytes || passed > fn->meta.kernarg_segment_size)
      return violation(hipErrorInvalidValue, k, "kernel-argument buffer of %lld bytes; the code object's explicit arguments "
                       "take %lld, its kernarg segment %lld", passed, (long long)fn->meta.explicit_bytes,
                       (long long)fn->meta.kernarg_segment_size);
  } else {
    if (!kernelParams) return violation(hipErrorInvalidValue, k, "neither kernelParams nor extra");
    style = "params";
    for (long long i = 0; i < fn->meta.explicit_args; i++)
      if (!kernelParams[i]) return violation(hipErrorInvalidValue, k, "kernelParams[%lld] is NULL (%lld explicit arguments)",
                                             i, (long long)fn->meta.explicit_args);
  }
  FILE *o = out();
  fprintf(o, "{\"event\":\"launch\",\"fnv1a64\":\"%016llx\",\"kernel\":", (unsigned long long)fn->mod->hash);
  json_str(o, k);
  fprintf(o, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"shared\":%u,\"args\":\"%s\",\"arg_bytes\":%lld}\n",
          gx, gy, gz, bx, by, bz, shared, style, passed);
  fflush(o);
  return exec_on() ? execute(fn, gx, gy, gz, bx, by, bz, shared, kernelParams, extra) : hipSuccess;
}

EXPORT hipError_t hipModuleUnload(hipModule_t module) {
  if (!module) return violation(hipErrorInvalidResourceHandle, NULL, "hipModuleUnload(NULL)");
  free(module);
  return hipSuccess;
}
