"""What is installed where: a torch package, an AOTriton install prefix, and how they match.

Nothing here imports torch: a torch whose AOTriton was swapped for a wrong one fails at
`import torch` (undefined symbol), and `status` must still explain it. Versions are read from
`torch/version.py` as text, libraries with our own ELF reader.
"""

from __future__ import annotations

import contextlib
import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from codegen.core.errors import EnvironmentMissing, UserError
from codegen.core.fsutil import sha256, sha256_file
from codegen.formats.elf import DynamicInfo, read_dynamic
from codegen.upstream.releases import (IMAGES_DIR, SUPPORTED, TORCH_LINES, parse_tag, release_line, release_name,
                                       tag_line)

# libaotriton<suffix>_v2.so.<major>.<minor>.<patch>; the suffix is upstream's AOTRITON_NAME_SUFFIX.
LIB_RE = re.compile(r"^libaotriton(?P<suffix>.*)_v2\.so\.(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)$")
HIP_LIB = "libtorch_hip.so"

# PyTorch feature release -> the AOTriton release its official wheels link, and the PyTorch branch
# a from-source rebuild uses: the records' `torch_lines` (codegen.upstream.releases, the one
# owner; docs/torch.md and docs/releases.md list the sources); status, rebuild-recipe and
# scripts/mi100_recipe.sh read it from here (TORCH_LINES, imported above).

# Image formats `torch install` was checked against on a real install tree: 'aks2' (up to
# 0.12.1b) and 0.13b's 'zip' (a smoke image build of 0.13b, installed into and restored from a
# ROCm-torch ELF fixture that links its v3 entry points, byte-identical; docs/torch.md).
# Snapshots of main (0.14.0-dev) are no release a PyTorch line links: not built for torch.
TORCH_IMAGE_FORMATS: tuple[str, ...] = ("aks2", "zip")
TORCH_RELEASES: tuple[str, ...] = tuple(a.release for a in SUPPORTED
                                        if a.image_format in TORCH_IMAGE_FORMATS and not a.snapshot)
TORCH_TO_AOTRITON: dict[str, str] = {t.torch: t.aotriton for t in TORCH_LINES}


def build_release_for_line(line: str) -> str | None:
    """The newest release of an AOTriton release line ('0.12') that mi100-codegen builds for
    PyTorch ('0.12.1b'); None when it builds none of that line (e.g. '0.9': no adapter, or an image
    format not in TORCH_IMAGE_FORMATS)."""
    best = None
    for tag in TORCH_RELEASES:
        v = parse_tag(tag)
        if v and release_line(v[0], v[1]) == line and (best is None or v > parse_tag(best)):
            best = tag
    return best


def torch_lines(tag: str) -> list[str]:
    """The PyTorch lines whose wheels link a release of the tag's line ('0.12.1b' -> ['2.13'])."""
    return [t.torch for t in TORCH_LINES if tag_line(t.aotriton) == tag_line(tag)]


def unsupported_line_message(tag: str) -> str:
    """One sentence for a release line mi100-codegen cannot build for PyTorch yet."""
    line = tag_line(tag) or tag
    torch = torch_lines(tag)
    who = f" (PyTorch {', '.join(torch)})" if torch else ""
    return (f"AOTriton {tag}{who}: mi100-codegen's torch integration does not support the {line} release "
            f"line yet; releases it builds for PyTorch: {', '.join(TORCH_RELEASES)}")


@dataclass(frozen=True)
class AotLib:
    """One AOTriton library file name, parsed."""

    name: str
    suffix: str
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, name: str) -> "AotLib | None":
        m = LIB_RE.match(name)
        if not m:
            return None
        return cls(name, m["suffix"], int(m["major"]), int(m["minor"]), int(m["patch"]))

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def tag(self) -> str:
        return release_name((self.major, self.minor, self.patch))

    @property
    def line(self) -> str:
        return release_line(self.major, self.minor)


def images_signature(arch_dir: Path) -> tuple[str, int]:
    """sha256 over the sorted `relative-path sha256` lines of every file of an image folder,
    and the file count: identifies one build's images independently of where they lie."""
    lines = []
    for f in sorted(p for p in arch_dir.rglob("*") if p.is_file()):
        lines.append(f"{f.relative_to(arch_dir).as_posix()} {sha256_file(f)}\n")
    return sha256("".join(lines).encode()), len(lines)


def image_archs(lib_dir: Path) -> dict[str, int]:
    """`amd-gfx90a` -> number of files, for each image folder next to a library."""
    root = lib_dir / IMAGES_DIR
    if not root.is_dir():
        return {}
    return {
        d.name: sum(1 for p in d.rglob("*") if p.is_file())
        for d in sorted(root.iterdir())
        if d.is_dir()
    }


# --- torch ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TorchInstall:
    root: Path  # the `torch` package folder
    version: str
    hip: str | None
    cuda: str | None
    hip_lib: Path | None  # torch/lib/libtorch_hip.so when present
    hip_dyn: DynamicInfo | None
    aot_needed: AotLib | None  # the AOTriton file name libtorch_hip.so needs

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"

    @property
    def is_rocm(self) -> bool:
        return self.hip is not None and self.hip_lib is not None

    @property
    def feature_release(self) -> str:
        m = re.match(r"^(\d+)\.(\d+)", self.version)
        return f"{m[1]}.{m[2]}" if m else self.version


def _version_py(path: Path) -> dict[str, object]:
    """Top-level `name = literal` assignments of torch/version.py, without running it."""
    out: dict[str, object] = {}
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError) as exc:
        raise UserError(f"{path}: cannot read torch's version file ({exc})") from None
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for t in targets:
            if isinstance(t, ast.Name):
                with contextlib.suppress(ValueError):
                    out[t.id] = ast.literal_eval(value)
    return out


def find_torch_dir(torch_dir: Path | None) -> Path:
    """The torch package folder: given, or the one this Python would import (not imported), as its
    one canonical path (links resolved, once, here): install, status and restore reached through a
    link or through the real path find the same folder, and the same backup beside it.

    No torch in this environment is a missing environment (EnvironmentMissing, exit 3, as for
    `tune` and `validate`); a `--torch-dir` that holds no torch is a path the user chose (exit 2)."""
    if torch_dir is not None:
        root = Path(torch_dir)
        if root.name != "torch" and (root / "torch" / "version.py").is_file():
            root = root / "torch"
        if not (root / "version.py").is_file():
            raise UserError(f"{torch_dir}: not a torch package folder (no version.py)",
                            hint="pass the folder that holds torch/version.py, e.g. .../site-packages/torch")
        return root.resolve()
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentMissing("torch is not installed in this Python environment",
                                 hint="activate the environment of your ROCm PyTorch, or pass --torch-dir")
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def inspect_torch(torch_dir: Path | None) -> TorchInstall:
    root = find_torch_dir(torch_dir)
    v = _version_py(root / "version.py")
    version = str(v.get("__version__", "unknown"))
    hip = v.get("hip")
    cuda = v.get("cuda")
    hip_lib = root / "lib" / HIP_LIB
    hip_dyn = None
    aot = None
    if hip_lib.is_file():
        hip_dyn = read_dynamic(hip_lib)
        for n in hip_dyn.needed:
            parsed = AotLib.parse(n)
            if parsed:
                aot = parsed
                break
    else:
        hip_lib = None
    return TorchInstall(
        root=root,
        version=version,
        hip=str(hip) if hip else None,
        cuda=str(cuda) if cuda else None,
        hip_lib=hip_lib,
        hip_dyn=hip_dyn,
        aot_needed=aot,
    )


# --- an AOTriton install prefix ------------------------------------------------------------------
@dataclass(frozen=True)
class PrefixInstall:
    root: Path
    lib: Path  # the real (non-symlink) versioned library file
    parsed: AotLib
    dyn: DynamicInfo

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"


def inspect_prefix(prefix: Path) -> PrefixInstall:
    prefix = Path(prefix)
    lib_dir = prefix / "lib"
    if not lib_dir.is_dir():
        raise UserError(f"{prefix}: not an AOTriton install prefix (no lib/ folder)",
                        hint="pass the CMAKE_INSTALL_PREFIX of your AOTriton build (`mi100-codegen build TREE --prefix PREFIX`)")
    found = []
    for p in sorted(lib_dir.iterdir()):
        parsed = AotLib.parse(p.name)
        if parsed and p.is_file() and not p.is_symlink():
            found.append((p, parsed))
    if not found:
        names = sorted(p.name for p in lib_dir.iterdir() if p.name.startswith("libaotriton"))
        raise UserError(
            f"{lib_dir}: no AOTriton library libaotriton_v2.so.X.Y.Z"
            + (f" (found only: {', '.join(names)})" if names else ""),
            hint="build and install AOTriton first (`ninja install`); a static build (.a) cannot be swapped in",
        )
    if len(found) > 1:
        raise UserError(f"{lib_dir}: several AOTriton libraries: {', '.join(p.name for p, _ in found)}",
                        hint="install each build into its own prefix")
    path, parsed = found[0]
    return PrefixInstall(root=prefix, lib=path, parsed=parsed, dyn=read_dynamic(path))


# --- symbols ---------------------------------------------------------------------------------------
_NS_RE = re.compile(r"(?:^|[^0-9])(\d+)(aotriton\w*)")


def aotriton_namespaces(symbols: frozenset[str] | set[str]) -> set[str]:
    """Itanium-mangled top namespaces of the form aotriton<suffix> found in these symbols."""
    out = set()
    for s in symbols:
        if not s.startswith("_Z"):
            continue
        for m in _NS_RE.finditer(s):
            n = int(m[1])
            ident = m[2][:n]
            if len(ident) == n and ident.startswith("aotriton"):
                out.add(ident)
    return out


def needed_aotriton_symbols(torch: TorchInstall, original: DynamicInfo | None) -> set[str]:
    """Symbols libtorch_hip.so expects from AOTriton: its undefined symbols in namespace
    `aotriton`, plus those the original library (when given) defines."""
    assert torch.hip_dyn is not None
    und = set(torch.hip_dyn.undefined)
    needed = {s for s in und if "aotriton" in aotriton_namespaces({s})}
    if original is not None:
        needed |= und & set(original.defined)
    return needed
