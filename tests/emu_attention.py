"""AOTriton's attention kernels from a real release tree, one at a time on the emulator, against an
fp64 reference (tests/test_emulate_attention.py and scripts/bench_emulate.py use it).

The plan of the tree (the overlay applied, the tree's own generator) gives each kernel's compile
line; codegen.emulate.aotriton compiles it and packs its arguments by name; the launches here are
the ones AOTriton's own torch functions make (tritonsrc/attn_torch_function.py): the forward's grid
(persistent kernels: one workgroup per tile slot and an atomic tile counter), causal as the
windowed type with window (seqlen_q, 0), the backward as preprocess + dk/dv + dq, or the fused
kernel with its dq blocks after the dk/dv blocks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from codegen.emulate.aotriton import Kernel, compile_entry
from codegen.models.emulate import Launch
from codegen.plan.kernel_list import kernel_arg_names
from codegen.ship.reference import attention, from_bytes, to_bytes
from codegen.upstream import signature_constant

DTYPES = ("fp16", "bf16")


def plan(tree: Path) -> list:
    """The gfx908 kernels of `tree`'s plan (the overlay applied to the tree first)."""
    from codegen.apply.engine import apply_overlay
    from codegen.formats.spec import load_spec
    from codegen.plan.kernel_list import generate_kernel_list

    apply_overlay(tree, load_spec(None))
    return generate_kernel_list(tree, ["gfx908_mod0"], arch="gfx908")


def constants(tree: Path, entry) -> dict:
    names = kernel_arg_names(str(Path(tree) / entry.source), entry.kernel_name)
    sig = [s.strip() for s in entry.signature.split(",")]
    return {n: c for n, s in zip(names or (), sig) if (c := signature_constant(s)) is not None}


def find(tree: Path, entries: list, family: str, dtype: str, head_dim: int, *, warps: int | None = None,
         block_m: int | None = None, block_n: int | None = None, **consts):
    """The first planned kernel of `family` with these axes and these constant arguments."""
    for e in entries:
        c = e.config
        if (c.family, c.dtype, c.head_dim) != (family, dtype, head_dim):
            continue
        if (warps and c.num_warps != warps) or (block_m and c.block_m != block_m) or (block_n and c.block_n != block_n):
            continue
        got = constants(tree, e)
        if all(got.get(k) == v for k, v in consts.items()):
            return e
    raise LookupError(f"no {family} {dtype} d{head_dim} w{warps} M{block_m} N{block_n} {consts} in the plan")


def _words(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(the kernel's input words, their exact fp64 values) of `x` in `dtype`."""
    w = np.frombuffer(to_bytes(x, dtype), np.uint16).reshape(x.shape)
    return w, _from_words(w, dtype)


def _from_words(w: np.ndarray, dtype: str) -> np.ndarray:
    return from_bytes(w.tobytes(), dtype, w.size).reshape(w.shape)


@dataclass
class Problem:
    """One attention call: shapes, type, causal (top-left), an additive bias, and its tensors."""

    dtype: str = "fp16"
    head_dim: int = 64
    batch: int = 1
    heads: int = 2
    seqlen_q: int = 96
    seqlen_k: int = 80
    causal: bool = False
    bias: bool = False
    dropout: float = 0.0
    seed: int = 0
    philox_seed: int = 0x1234_5678_9ABC_DEF0
    philox_offset: tuple[int, int] = (0x1_0000_0010, 7)   # *philox_offset1, philox_offset2
    t: dict = field(default_factory=dict)     # name -> (words, fp64)

    def __post_init__(self):
        rng = np.random.default_rng(self.seed)
        b, h, m, n, d = self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.head_dim
        for name, shape in (("q", (b, h, m, d)), ("k", (b, h, n, d)), ("v", (b, h, n, d)), ("do", (b, h, m, d)),
                            ("b", (b, h, m, n))):
            self.t[name] = _words(rng.standard_normal(shape), self.dtype)

    @property
    def sm_scale(self) -> float:
        return 1 / math.sqrt(self.head_dim)

    def keep(self) -> np.ndarray:
        """The dropout mask AOTriton's kernels draw (tritonsrc/dropout.py): element (i, j) of head
        zh keeps when int32(r) > int32((p - 0.5) * 2**32), r an output of Triton's Philox 4x32-10
        at offset base + (zh*seqlen_q + i)*ceil(seqlen_k/4) + j/4: r0, r2, r1, r3 for j % 4 = 0..3
        (tl.join(tl.join(r0, r1), tl.join(r2, r3)) flattened)."""
        b, h, m, n = self.batch, self.heads, self.seqlen_q, self.seqlen_k
        stride = -(-n // 4)
        zh, i, j = np.meshgrid(np.arange(b * h, dtype=np.uint64), np.arange(m, dtype=np.uint64),
                               np.arange(n, dtype=np.uint64), indexing="ij")
        off = np.uint64(sum(self.philox_offset)) + (zh * np.uint64(m) + i) * np.uint64(stride) + j // np.uint64(4)
        r0, r1, r2, r3 = philox4x32(self.philox_seed, off)
        r = [r0, r2, r1, r3]
        pick = np.choose((j % np.uint64(4)).astype(np.int64), r)
        idp = np.int32(np.float32(np.float32(self.dropout) - np.float32(0.5)) * np.float32(4294967295.0))
        return (pick.astype(np.uint32).view(np.int32) > idp).reshape(b, h, m, n)

    def reference(self) -> dict[str, np.ndarray]:
        """fp64 (codegen.ship.reference, the one reference `execute` uses): out, lse (natural
        log), delta, dq, dk, dv, db, with this problem's own Philox mask for dropout."""
        q, k, v, do = (self.t[n][1] for n in ("q", "k", "v", "do"))
        r = attention(q, k, v, do, scale=self.sm_scale, causal=self.causal,
                      bias=self.t["b"][1] if self.bias else None, keep=self.keep() if self.dropout else None,
                      dropout_p=self.dropout)
        return {"out": r.out, "lse": r.lse.reshape(q.shape[:3]), "delta": (do * r.out).sum(-1), "dv": r.dv,
                "dq": r.dq, "dk": r.dk, "db": r.db}


def _strides(prefix: str, shape: tuple, letters: str = "zhm") -> dict[str, int]:
    s = [int(np.prod(shape[i + 1:])) for i in range(3)]
    return {f"stride_{prefix}{c}": v for c, v in zip(letters, s)}


class Session:
    """The tensors of one Problem in a Machine's arena, and its kernels' launches."""

    def __init__(self, machine, problem: Problem, budget: int = 20_000_000):
        self.m, self.p, self.budget = machine, problem, budget
        a = machine.arena
        self.ptr = {}
        for name, (words, _) in problem.t.items():
            self.ptr[name] = a.alloc(words.nbytes)
            a.write(self.ptr[name], words.tobytes())
        p = problem
        md, nd = (p.batch, p.heads, p.seqlen_q, p.head_dim), (p.batch, p.heads, p.seqlen_k, p.head_dim)
        for name, shape, size in (("out", md, 2), ("dq", md, 2), ("dk", nd, 2), ("dv", nd, 2),
                                  ("db", (p.batch, p.heads, p.seqlen_q, p.seqlen_k), 2),
                                  ("lse", md[:3], 4), ("delta", md[:3], 4), ("counter", (1,), 4),
                                  ("seed", (1,), 8), ("offset1", (1,), 8)):
            self.ptr[name] = a.alloc(int(np.prod(shape)) * size)
            a.write(self.ptr[name], bytes(int(np.prod(shape)) * size))
        a.write(self.ptr["seed"], p.philox_seed.to_bytes(8, "little"))
        a.write(self.ptr["offset1"], p.philox_offset[0].to_bytes(8, "little"))
        q, k, b = md, nd, (p.batch, p.heads, p.seqlen_q, p.seqlen_k)
        self.values = {
            "Q": self.ptr["q"], "K": self.ptr["k"], "V": self.ptr["v"], "B": self.ptr["b"] if p.bias else 0,
            "Out": self.ptr["out"], "L": self.ptr["lse"], "DO": self.ptr["do"], "D": self.ptr["delta"],
            "Delta": self.ptr["delta"], "DQ": self.ptr["dq"], "DK": self.ptr["dk"], "DV": self.ptr["dv"],
            "DB": self.ptr["db"] if p.bias else 0, "persistent_atomic_counter": self.ptr["counter"],
            "Sm_scale": p.sm_scale, "sm_scale": p.sm_scale, "Num_CU": 1, "Batch": p.batch, "Num_seqlens": 0,
            "num_seqlens": 0, "Num_head_q": p.heads, "Num_head_k": p.heads, "num_head_q": p.heads,
            "num_head_k": p.heads, "Max_seqlen_q": p.seqlen_q, "Max_seqlen_k": p.seqlen_k,
            "max_seqlen_q": p.seqlen_q, "max_seqlen_k": p.seqlen_k, "seqlen_q": p.seqlen_q,
            "Head_dim": p.head_dim, "head_dim": p.head_dim,
            "Window_left": p.seqlen_q if p.causal else 0, "Window_right": 0, "dropout_p": p.dropout,
            "philox_seed_ptr": self.ptr["seed"], "philox_offset1": self.ptr["offset1"],
            "philox_offset2": p.philox_offset[1],
            **_strides("q", q), **_strides("k", k, "zhn"), **_strides("v", k, "zhk"), **_strides("o", q),
            **_strides("do", q), **_strides("dq", q), **_strides("dk", k, "zhn"), **_strides("dv", k, "zhk"),
            **_strides("b", b), **_strides("db", b)}

    def launch(self, kernel: Kernel, grid: tuple[int, int, int]):
        vals = {n: self.values[n] for n, _ in kernel.args if n in self.values}
        return self.m.execute(kernel.code_object, Launch(kernel=kernel.name, grid=grid,
                                                         block=(64 * kernel.entry.config.num_warps, 1, 1),
                                                         dynamic_lds=kernel.shared, kernarg=kernel.pack(vals)),
                              budget=self.budget)

    def read(self, name: str) -> np.ndarray:
        p = self.p
        shapes = {"out": (p.batch, p.heads, p.seqlen_q, p.head_dim), "dq": (p.batch, p.heads, p.seqlen_q, p.head_dim),
                  "dk": (p.batch, p.heads, p.seqlen_k, p.head_dim), "dv": (p.batch, p.heads, p.seqlen_k, p.head_dim),
                  "db": (p.batch, p.heads, p.seqlen_q, p.seqlen_k), "lse": (p.batch, p.heads, p.seqlen_q),
                  "delta": (p.batch, p.heads, p.seqlen_q)}
        shape = shapes[name]
        if name in ("lse", "delta"):
            return np.frombuffer(self.m.arena.read(self.ptr[name], int(np.prod(shape)) * 4), np.float32).reshape(shape)
        raw = np.frombuffer(self.m.arena.read(self.ptr[name], int(np.prod(shape)) * 2), np.uint16).reshape(shape)
        return _from_words(raw, p.dtype)

    def forward(self, kernel: Kernel):
        p, c = self.p, kernel.entry.config
        consts = constants_of(kernel)
        tiles = math.ceil(p.seqlen_q / c.block_m) * p.heads * p.batch
        if consts.get("PERSISTENT_TYPE", 0):
            self.m.arena.write(self.ptr["counter"], bytes(4))
            grid = (min(self.values["Num_CU"] * int(consts.get("GRID_CU_MULTIP", 1)), tiles), 1, 1)
        else:
            grid = (math.ceil(p.seqlen_q / c.block_m), p.heads, p.batch)
        return self.launch(kernel, grid)

    def preprocess(self, kernel: Kernel):
        p = self.p
        return self.launch(kernel, (math.ceil(p.seqlen_q / kernel.entry.config.block_m), p.heads, p.batch))

    def dk_dv(self, kernel: Kernel):
        p = self.p
        return self.launch(kernel, (math.ceil(p.seqlen_k / kernel.entry.config.block_n), p.heads, p.batch))

    def dq(self, kernel: Kernel):
        p = self.p
        return self.launch(kernel, (math.ceil(p.seqlen_q / kernel.entry.config.block_m), p.heads, p.batch))

    def fused(self, kernel: Kernel):
        p, bn = self.p, kernel.entry.config.block_n
        return self.launch(kernel, (math.ceil(p.seqlen_k / bn) + math.ceil(p.seqlen_q / bn), p.heads, p.batch))


def philox4x32(seed: int, offsets: np.ndarray) -> list[np.ndarray]:
    """Triton's tl.randint4x(seed, offsets) (triton/language/random.py): Philox 4x32, 10 rounds,
    counter (offset low, offset high, 0, 0), key (seed low, seed high)."""
    m32 = np.uint64(0xFFFFFFFF)
    c0, c1 = offsets & m32, offsets >> np.uint64(32)
    c2 = c3 = np.zeros_like(offsets)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    a_, b_ = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        pa, pb = a_ * c0, b_ * c2
        c0, c2, c1, c3 = (pb >> np.uint64(32)) ^ c1 ^ k0, (pa >> np.uint64(32)) ^ c3 ^ k1, pb & m32, pa & m32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m32, (k1 + np.uint64(0xBB67AE85)) & m32
    return [c0, c1, c2, c3]


_CONSTS: dict[str, dict] = {}


def constants_of(kernel: Kernel) -> dict:
    """The constant arguments of a compiled kernel's signature, by name (set by `compile_in`)."""
    return _CONSTS[kernel.entry.id]


def compile_in(tree: Path, entry) -> Kernel:
    _CONSTS[entry.id] = constants(tree, entry)
    return compile_entry(tree, entry)
