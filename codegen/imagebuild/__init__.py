"""Build and install AOTriton for a target from a tree that carries the overlay, and verify it.

    build_tree(BuildOptions(tree, prefix, ...), console) -> BuildReport   # the `build` command's whole job
    check_overlay / check_prerequisites / plan_configure / run_ninja / verify_install   # its steps
"""

from codegen.imagebuild.builder import BuildOptions, BuildReport, build_tree
from codegen.imagebuild.configure import BuildRequest, ConfigurePlan, plan_configure
from codegen.imagebuild.overlay import OverlayError, check_overlay
from codegen.imagebuild.prereq import PrerequisiteError, Toolchain, check_prerequisites
from codegen.imagebuild.verify import Verification, verify_install

__all__ = ["BuildReport", "BuildRequest", "ConfigurePlan", "OverlayError", "PrerequisiteError", "Toolchain",
           "Verification", "build_tree", "check_overlay", "check_prerequisites", "plan_configure", "verify_install"]
