"""Apply the rendered overlay to an AOTriton tree, and revert it (the only stage that writes into
someone else's checkout).

    from codegen.apply.engine import apply_overlay
    from codegen.apply.revert import revert_tree
    result = apply_overlay(tree, load_spec(None), pretend=False)   # -> Result (per-file verdicts)
    revert_tree(tree)                                             # byte-exact restore

See docs/apply.md. Submodules: `edits` (anchored edits), `dbrows` (tuning-database rows),
`journal` (atomic transaction + recovery), `lock` (the lock file and its one reader), `state`
(verdicts, results, checks apply and revert share), `engine` (apply = plan + commit), `revert`,
`cli` (Typer commands). This package module imports none of
them, so that reading a lock (`codegen.apply.lock`, used by build) does not load the engine.
"""
