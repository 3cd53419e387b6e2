"""Layout families of AOTriton trees: where the generated module goes, how it imports upstream's
Config class, and where the tables the anchored edits touch live. An adapter names its layout
(`Adapter.layout`); `layout_of(name)` gives the record."""

from __future__ import annotations

from dataclasses import dataclass

from codegen.upstream.edits import EditPaths

MODULE_NAME = "mi100_codegen_space"


@dataclass(frozen=True)
class Layout:
    name: str
    module_path: str       # the generated tuning-space module, tree-relative
    config_import: str     # the module the generated code imports upstream's Config from
    module_template: str   # templates/<this>: the generated module (emitted code)
    edit_paths: EditPaths


LAYOUTS: dict[str, Layout] = {
    "v3python": Layout(
        name="v3python",
        module_path=f"v3python/{MODULE_NAME}.py",
        config_import="v3python.autotune",
        module_template="v3python/tuning_space.py.j2",
        edit_paths=EditPaths(
            gpu_targets="v3python/gpu_targets.py", compile="v3python/compile.py",
            util_h="include/aotriton/util.h", util_cc="v3src/util.cc", cmake="CMakeLists.txt",
            kdesc="v3python/kernel/kdesc.py", op_attn_fwd="v3python/rules/flash/op_attn_fwd.py",
        ),
    ),
    # 0.13b: the package `aotriton` (source python/); the kdesc hook imports the module relatively
    # from aotriton.template_instantiation.ir.kdesc, so it sits in python/template_instantiation/.
    "aotriton-python": Layout(
        name="aotriton-python",
        module_path=f"python/template_instantiation/{MODULE_NAME}.py",
        config_import="aotriton.autotune",
        module_template="v3python/tuning_space.py.j2",  # the same emitted code; only the import differs
        edit_paths=EditPaths(
            gpu_targets="python/gpu_targets.py", compile="python/compile.py",
            util_h="include/aotriton/util.h", util_cc="v3src/util.cc", cmake="CMakeLists.txt",
            kdesc="python/template_instantiation/ir/kdesc.py", op_attn_fwd="modules/flash/aot/_common.py",
            head_dims_function="block_dmodel_values",
        ),
    ),
}
DEFAULT_LAYOUT = "v3python"


def layout_of(name: str) -> Layout:
    return LAYOUTS[name]
