"""The environment the tree's own Python tools (generator, database composer, compiler driver)
run in. For a layout whose generator package is a tree folder under another name (0.13b:
`python/` is the package `aotriton`, which upstream's CMake pip-installs into its build venv),
`importable` makes it importable without installing anything and without writing into the tree:
a temporary folder holding one symlink `<package> -> TREE/<package_dir>`, put on PYTHONPATH.
Layouts whose package is a folder of the tree root (v3python/) need nothing: the tools run with
the tree root as working directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from codegen.upstream import Adapter


def package_name(adapter: Adapter) -> str:
    """The top-level package the tools are run from ('v3python', 'aotriton')."""
    return adapter.generator_module.split(".")[0]


@contextmanager
def importable(adapter: Adapter, tree: Path | str) -> Iterator[dict[str, str]]:
    """Yields the environment entries to add for the tree's tools ({} or {'PYTHONPATH': dir});
    the temporary folder is removed afterwards."""
    if adapter.package_dir is None:
        yield {}
        return
    pkg = Path(tempfile.mkdtemp(prefix="mi100-codegen-pkg-"))
    try:
        (pkg / package_name(adapter)).symlink_to(Path(tree).resolve() / adapter.package_dir,
                                                 target_is_directory=True)
        yield {"PYTHONPATH": str(pkg)}
    finally:
        shutil.rmtree(pkg, ignore_errors=True)


def with_pythonpath(env: dict[str, str] | None, extra: dict[str, str]) -> dict[str, str]:
    """`env` (default: this process's) plus `extra` from `importable`."""
    out = dict(os.environ if env is None else env)
    out.update(extra)
    return out
