"""Apply the rendered overlay to an AOTriton tree, and revert it (the only stage that writes into
someone else's checkout).

    from codegen.apply import apply_overlay, revert_tree
    result = apply_overlay(tree, load_spec(None), pretend=False)   # -> Result (per-file verdicts)
    revert_tree(tree)                                             # byte-exact restore

See docs/apply.md. Submodules: `edits` (anchored edits), `dbrows` (tuning-database rows),
`journal` (atomic transaction + recovery), `engine` (apply/revert), `cli` (Typer commands).
"""

from .engine import (
    BACKUP_DIR,
    LOCK_NAME,
    ApplyConflict,
    EditVerdict,
    FileVerdict,
    Result,
    apply_overlay,
    read_lock,
    recover_tree,
    revert_tree,
)

__all__ = ["BACKUP_DIR", "LOCK_NAME", "ApplyConflict", "EditVerdict", "FileVerdict", "Result", "apply_overlay",
           "read_lock", "recover_tree", "revert_tree"]
