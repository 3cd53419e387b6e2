"""Apply the rendered overlay to an AOTriton tree, and revert it (the only stage that writes into
someone else's checkout).

    from codegen.apply import apply_overlay, revert_tree
    result = apply_overlay(tree, load_spec(None), pretend=False)   # -> Result (per-file verdicts)
    revert_tree(tree)                                             # byte-exact restore

See docs/apply.md. Submodules: `edits` (anchored edits), `dbrows` (tuning-database rows),
`journal` (atomic transaction + recovery), `lock` (the lock file and its one reader), `engine`
(apply = plan + commit, revert), `cli` (Typer commands).
"""

from .engine import (
    BACKUP_DIR,
    ApplyConflict,
    ApplyPlan,
    EditVerdict,
    FileVerdict,
    Result,
    apply_overlay,
    commit_apply,
    plan_apply,
    recover_tree,
    revert_tree,
)
from .lock import LOCK_NAME, ApplyLock, read_lock

__all__ = ["BACKUP_DIR", "LOCK_NAME", "ApplyConflict", "ApplyLock", "ApplyPlan", "EditVerdict", "FileVerdict",
           "Result", "apply_overlay", "commit_apply", "plan_apply", "read_lock", "recover_tree", "revert_tree"]
