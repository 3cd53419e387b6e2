"""A tiny synthetic AOTriton-like tree for fast tests (no upstream code: only the anchor lines
the edit catalogue needs, and small tuning databases with the upstream table shapes).

`make_fake_tree(root, version=(0, 12, 0))` builds a sharded-layout tree (0.11.1b and later) or,
for (0, 10, 0)/(0, 11, 0), a central-DB tree. The donor GPU gfx90a_mod0 gets a complete 2x2
seqlen grid for head dims 32/64, all three dtypes, causal 0/3, dropout 0/1, bias 0/1.
"""

from __future__ import annotations

import itertools
import sqlite3
import tempfile
from pathlib import Path

from codegen.formats.tuning_db import write_archive

KEY = ["gpu", "inputs$Q_dtype", "inputs$max_seqlen_q", "inputs$max_seqlen_k", "inputs$CAUSAL_TYPE",
       "inputs$BLOCK_DMODEL", "inputs$ENABLE_DROPOUT", "inputs$PADDED_HEAD", "inputs$BIAS_TYPE"]
KERNEL_COLS = {
    "attn_fwd": ["tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N", "tuned_kernel$PRE_LOAD_V",
                 "compiler_options$waves_per_eu", "compiler_options$num_warps", "compiler_options$num_stages"],
    "bwd_kernel_dk_dv": ["tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N", "compiler_options$waves_per_eu",
                         "compiler_options$num_warps", "compiler_options$num_stages"],
}
OP_COLS = ["op$backend"]


def _schema(table: str, extra: list[str], with_id: bool) -> str:
    cols = (["id INTEGER PRIMARY KEY"] if with_id else []) + [
        f'"{c}" TEXT' if c in ("gpu", "inputs$Q_dtype") else f'"{c}" INTEGER' for c in KEY + extra]
    return f'CREATE TABLE "{table}" ({", ".join(cols)}, UNIQUE({", ".join(chr(34) + k + chr(34) for k in KEY)}))'


def _rows(gpu: str, nextra: int, seed: int) -> list[tuple]:
    out = []
    grid = itertools.product(["torch.float16", "torch.bfloat16", "torch.float32"], [16, 128], [16, 128],
                             [0, 3], [32, 64], [0, 1], [0], [0, 1])
    for n, (dt, sq, sk, causal, hd, drop, pad, bias) in enumerate(grid):
        if causal and bias:
            continue
        tile = [(128, 64), (64, 64), (64, 32)][(n + seed) % 3]
        cfg = [tile[0], tile[1]] + ([0] if nextra == 6 else []) + [2, 4, 1]
        out.append((gpu, dt, sq, sk, causal, hd, drop, pad, bias, *cfg))
    return out


def _db(tables: dict[str, tuple[list[str], list[tuple]]], with_id: bool) -> bytes:
    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "db.sqlite3"
        conn = sqlite3.connect(p)
        for name, (extra, rows) in tables.items():
            conn.execute(_schema(name, extra, with_id))
            cols = KEY + extra
            conn.executemany(f'INSERT INTO "{name}" ({", ".join(chr(34) + c + chr(34) for c in cols)}) '
                             f'VALUES ({", ".join("?" * len(cols))})', rows)
        conn.commit()
        conn.close()
        return p.read_bytes()


FILES = {
    "include/aotriton/util.h": "enum AOTRITON_API Gpu : uint64_t {\n  GPU_ARCH_UNKNOWN = 0,\n"
                               "  GPU_AMD_ARCH_GFX90A_MOD0  = TRICAT(GpuVendor::kAMD,  0x90a, 0),\n"
                               "  GPU_AMD_ARCH_GFX942_MOD0  = TRICAT(GpuVendor::kAMD,  0x942, 0),\n};\n",
    "v3src/util.cc": "std::unordered_map<std::string, GpuClassifier> LazyGpu::string_to_classifier = {\n"
                     '  { "gfx90a", DummyClassifier<GPU_AMD_ARCH_GFX90A_MOD0 >() },\n};\n'
                     "bool isArchExperimentallySupported(int vendor_arch) {\n"
                     "  return (vendor_arch == CAT32(GpuVendor::kAMD, 0x1101) ||\n"
                     "          vendor_arch == CAT32(GpuVendor::kAMD, 0x1200));\n}\n",
    "v3python/gpu_targets.py": "AOTRITON_SUPPORTED_GPUS = (\n    'gfx90a_mod0',\n    'gfx942_mod0',\n)\n\n"
                               "AOTRITON_TUNING_DATABASE_REUSE = {\n}\n\n"
                               "AOTRITON_ARCH_TO_PACK = {\n    'gfx90a'    : 'gfx90a',\n    'gfx942'    : 'gfx942',\n}\n\n"
                               "AOTRITON_ARCH_WARPSIZE = {\n    'gfx90a'     : 64,\n    'gfx1100'    : 32,\n}\n",
    "v3python/compile.py": "KNOWN_TARGETS_64 = ['gfx90a', 'gfx942', 'gfx950']\n",
    "v3python/generate.py": "# generator entry point (fake)\n",
    "v3python/database_compose.py": "# compose (fake)\n",
    "v3python/kernel/kdesc.py": "class KernelDescription:\n    def gen_signatures_for_tuning(self, f):\n"
                                "        for cfg in self.gen_autotune_configs(f):\n            yield cfg\n",
    "v3python/rules/flash/op_attn_fwd.py": "import os\n"
                                           "AOTRITON_FLASH_BLOCK_DMODEL = os.getenv('AOTRITON_FLASH_BLOCK_DMODEL', "
                                           "default='16, 32, 64, 128')\n"
                                           "AOTRITON_FLASH_BLOCK_DMODEL = [int(d) for d in "
                                           "AOTRITON_FLASH_BLOCK_DMODEL.split(',')]\n",
}


def make_fake_tree(root: Path, version: tuple[int, int, int] = (0, 12, 0)) -> Path:
    root = Path(root)
    major, minor, patch = version
    files = dict(FILES)
    files["CMakeLists.txt"] = (
        f"project(AOTriton CXX C)\nset(AOTRITON_VERSION_MAJOR_INT {major})\nset(AOTRITON_VERSION_MINOR_INT {minor})\n"
        f"set(AOTRITON_VERSION_PATCH_INT {patch})\n"
        'set(AOTRITON_TARGET_ARCH "gfx90a;gfx942" CACHE STRING "Target GPU Architecture.")\n')
    if version < (0, 12, 0):
        files["v3python/gpu_targets.py"] += "\nAOTRITON_ARCH_PRODUCTION_LINE = {\n    'gfx90a'     : 'CDNA',\n}\n"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    kernels = {f"FLASH${k}": (cols, _rows("gfx90a_mod0", len(cols), s) + _rows("gfx942_mod0", len(cols), s + 1))
               for s, (k, cols) in enumerate(KERNEL_COLS.items())}
    op_rows = [r[:9] + (r[9] % 2,) for r in _rows("gfx90a_mod0", 5, 0)]
    central = version in ((0, 10, 0), (0, 11, 0))
    if central:
        rules = root / "v3python/rules"
        rules.mkdir(parents=True, exist_ok=True)
        (rules / "tuning_database.sqlite3.tar.xz").write_bytes(
            write_archive("tuning_database.sqlite3", _db(kernels, True)))
        if version == (0, 11, 0):
            (rules / "op_database.sqlite3.tar.xz").write_bytes(
                write_archive("op_database.sqlite3", _db({"FLASH$op_attn_bwd": (OP_COLS, op_rows)}, True)))
    else:
        db = root / "v3python/database"
        db.mkdir(parents=True, exist_ok=True)
        (db / "tuning_database.sqlite3.tar.xz").write_bytes(
            write_archive("tuning_database.sqlite3", _db({k: (c, []) for k, (c, _) in kernels.items()}, False)))
        (db / "op_database.sqlite3.tar.xz").write_bytes(
            write_archive("op_database.sqlite3", _db({"FLASH$op_attn_bwd": (OP_COLS, op_rows)}, True)))
        for gpu in ("gfx90a_mod0", "gfx942_mod0"):
            arch = gpu.split("_")[0]
            for name, (cols, rows) in kernels.items():
                k = name.split("$")[1]
                shard = db / "amd" / arch / "flash" / f"{k}.sqlite3.tar.xz"
                shard.parent.mkdir(parents=True, exist_ok=True)
                shard.write_bytes(write_archive(f"{k}.sqlite3",
                                              _db({name: (cols, [r for r in rows if r[0] == gpu])}, False)))
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file (bytes) and directory (None) below root, by relative path."""
    root = Path(root)
    out: dict[str, bytes] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = p.read_bytes() if p.is_file() else b"<dir>"
    return out


__all__ = ["make_fake_tree", "snapshot"]


def releases_line() -> str:
    """The embedded spec's `upstream.releases` line as written (`  releases: [0.10b, …]`)."""
    from codegen.core.resources import default_spec_path

    return next(ln for ln in default_spec_path().read_text().splitlines() if ln.strip().startswith("releases:"))


def spec_variant(tmp_path: Path, **replacements: str) -> Path:
    """A copy of the embedded spec with each `old` text replaced by `new` (each must occur)."""
    from codegen.core.resources import default_spec_path

    text = default_spec_path().read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    p = Path(tmp_path) / "variant.yaml"
    p.write_text(text)
    return p
