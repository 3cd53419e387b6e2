"""Build and install AOTriton for a target from a tree that carries the overlay, and verify it.

    build_tree(BuildOptions(tree, prefix, ...), console) -> BuildReport   # the `build` command's whole job
    check_overlay / check_prerequisites / plan_configure / run_ninja / verify_install   # its steps
"""
