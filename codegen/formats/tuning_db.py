"""Upstream's tuning database: table and column names, and how a measured winner becomes a row.

Tables are `FLASH$<family>`; columns are `gpu`, `inputs$…` (the functional: the LUT key),
`tuned_kernel$…` and `compiler_options$…` (the config). attn_fwd spells its seqlen columns
`inputs$Max_seqlen_q`, the others `inputs$max_seqlen_q`: column lookups are case-insensitive.
Same in every supported release (0.10b .. 0.12b).
"""

from __future__ import annotations

from codegen.models.dtypes import DTYPE_INFO
from codegen.models.rows import Winner

TABLE_PREFIX = "FLASH$"
GPU = "gpu"
DTYPE = "inputs$Q_dtype"
HEAD_DIM = "inputs$BLOCK_DMODEL"
SEQLEN_Q = "inputs$max_seqlen_q"
SEQLEN_K = "inputs$max_seqlen_k"
INPUT_PREFIX = "inputs$"
# winner field -> column: the functional flags a winner is matched on (as booleans) ...
FLAG_COLUMNS = {"causal": "inputs$CAUSAL_TYPE", "dropout": "inputs$ENABLE_DROPOUT", "bias": "inputs$BIAS_TYPE"}
# ... and the config a winner sets
CONFIG_COLUMNS = {"block_m": "tuned_kernel$BLOCK_M", "block_n": "tuned_kernel$BLOCK_N",
                  "waves_per_eu": "compiler_options$waves_per_eu", "num_warps": "compiler_options$num_warps",
                  "num_stages": "compiler_options$num_stages", "pre_load_v": "tuned_kernel$PRE_LOAD_V"}
# Causal rows are stored as CAUSAL_TYPE 3 (windowed, top-left), the others as 0.
CAUSAL_TYPE_CAUSAL = 3

# The op database (0.11b and later; 0.10b has none) picks a backend per backward pass: `op$backend`
# is the backend's index in upstream's list, the same in 0.11b..0.13b (0.11b..0.12.1b: the order
# of `OpAttnBwd([...])` in v3python/rules/flash/__init__.py; 0.13b: `@ati.backend(n, ...)` in
# modules/flash/aot/__init__.py; tests/test_targets_real.py reads both). A GPU without rows
# gets the first backend, the split one.
OP_ATTN_BWD_TABLE = TABLE_PREFIX + "op_attn_bwd"
OP_BACKEND = "op$backend"
BWD_BACKEND_SPLIT = 0   # 'triton_split': bwd_kernel_dk_dv + bwd_kernel_dq (and bwd_preprocess)
BWD_BACKEND_FUSED = 1   # 'bwd_kernel_fuse'


def family_of(table: str) -> str:
    return table.split("$", 1)[1] if "$" in table else table


def table_of(family: str) -> str:
    return f"{TABLE_PREFIX}{family}"


def column(cols: list[str], name: str) -> str | None:
    """Case-insensitive column lookup."""
    for c in cols:
        if c.lower() == name.lower():
            return c
    return None


def winner_config(w: Winner) -> dict[str, int]:
    """The config columns a winner sets (only the fields it has), in the database's values."""
    out = {}
    for field, col in CONFIG_COLUMNS.items():
        v = getattr(w, field)
        if v is not None:
            out[col] = int(v)
    return out


def winner_row(w: Winner) -> tuple[str, dict]:
    """A winner -> (table, {column: value}) of a complete row in upstream's schema. The row's key
    is gpu + every `inputs$` column: replacing a seeded row means deleting the rows whose key
    matches (compare with `IS`, NULLs occur) and inserting this one."""
    fwd = w.family == "attn_fwd"
    causal = bool(w.causal)
    seq = ("inputs$Max_seqlen_q", "inputs$Max_seqlen_k") if fwd else (SEQLEN_Q, SEQLEN_K)
    cols: dict = {GPU: w.gpu, DTYPE: DTYPE_INFO[w.dtype].db_value, seq[0]: w.seqlen_q, seq[1]: w.seqlen_k,
                  "inputs$CAUSAL_TYPE": CAUSAL_TYPE_CAUSAL if causal else 0, HEAD_DIM: w.head_dim,
                  "inputs$ENABLE_DROPOUT": int(w.dropout or 0), "inputs$PADDED_HEAD": 0,
                  "inputs$BIAS_TYPE": int(w.bias or 0)}
    extra = ("inputs$USE_ALIBI", "inputs$INT8", "inputs$INT8_KV", "inputs$USE_P_SCALE")
    if fwd:
        cols.update({c: 0 for c in extra})
        cols.update({"tuned_kernel$PERSISTENT_TYPE": 2 if causal else 0, "tuned_kernel$GRID_CU_MULTIP": 2})
    elif w.family == "bwd_kernel_fuse":
        # stored as NULL in every FLASH$bwd_kernel_fuse row of 0.11b (and SQLite's UNIQUE treats
        # NULLs as distinct), so an ON CONFLICT upsert never fires: delete with `IS`, then insert.
        cols.update({c: None for c in extra})
    cfg = winner_config(w.model_copy(update={"pre_load_v": bool(w.pre_load_v)} if fwd else {"pre_load_v": None}))
    cols.update({k: cfg[k] for k in ("tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N")})
    if fwd:
        cols["tuned_kernel$PRE_LOAD_V"] = cfg["tuned_kernel$PRE_LOAD_V"]
    cols.update({k: cfg[k] for k in ("compiler_options$waves_per_eu", "compiler_options$num_warps",
                                     "compiler_options$num_stages")})
    return table_of(w.family), cols


__all__ = ["BWD_BACKEND_FUSED", "BWD_BACKEND_SPLIT", "CAUSAL_TYPE_CAUSAL", "CONFIG_COLUMNS", "DTYPE",
           "FLAG_COLUMNS", "GPU", "HEAD_DIM", "OP_ATTN_BWD_TABLE", "OP_BACKEND", "SEQLEN_K", "SEQLEN_Q", "column", "family_of", "table_of", "winner_config", "winner_row"]
