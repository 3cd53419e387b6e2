"""The anchored edits that register a target arch in an AOTriton tree, as typed records.

Each record is data: the apply engine computes the changed text from the upstream file at apply
time (cloning the neighbour line keeps the file's own alignment). Anchors are a symbol plus a
neighbour, never line numbers. Records name files by role (`EditPaths`); the release family's
layout (`codegen.upstream.layouts`) supplies the paths, so another layout can reuse the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from codegen.models import TargetSpec
from codegen.models.target import gpu_mod
from codegen.upstream.knobs import HEAD_DIMS_ENV

# The provenance label of edits.json and of each edit in it: the module that builds the records.
CATALOGUE = "codegen/upstream/edits.py"

Payload = Union[str, dict]


@dataclass(frozen=True)
class EditRecord:
    id: str
    path: str
    op: str  # see codegen.apply.edits.OPS
    symbol: str
    neighbour: str
    payload: Payload
    why: str
    optional: bool = False
    position: str | None = None  # 'before' (default) or 'after' the neighbour

    def to_json(self) -> dict:
        d = {"id": self.id, "path": self.path, "op": self.op, "symbol": self.symbol, "neighbour": self.neighbour,
             "payload": self.payload, "why": self.why, "optional": self.optional,
             "template": CATALOGUE}
        if self.position is not None:
            d["position"] = self.position
        return d

    @classmethod
    def from_json(cls, d: dict) -> "EditRecord":
        return cls(d["id"], d["path"], d["op"], d["symbol"], d["neighbour"], d["payload"], d.get("why", ""),
                   bool(d.get("optional", False)), d.get("position"))


@dataclass(frozen=True)
class EditPaths:
    """Where each table the edits touch lives, for one layout family."""

    gpu_targets: str
    compile: str
    util_h: str
    util_cc: str
    cmake: str
    kdesc: str
    op_attn_fwd: str  # the file that reads the head-dims env var
    head_dims_function: str | None = None  # None: a module-level assignment reads it; else this function


def _python_tables(spec: TargetSpec, p: EditPaths) -> list[EditRecord]:
    like, arch = spec.registration.like, spec.arch
    out = [EditRecord(f"gpu_targets.supported_gpus.{gpu}", p.gpu_targets, "python.seq_insert",
                      "AOTRITON_SUPPORTED_GPUS", f"'{like}_mod0'", f"'{gpu}'",
                      "argparse choices of the generator; without it the target list is empty")
           for gpu in spec.gpus]

    def table(id_: str, symbol: str, value: str, why: str, optional: bool = False) -> EditRecord:
        return EditRecord(id_, p.gpu_targets, "python.dict_insert", symbol, f"'{like}'",
                          {"key": f"'{arch}'", "value": value}, why, optional)

    out += [
        table("gpu_targets.arch_to_pack", "AOTRITON_ARCH_TO_PACK", f"'{arch}'",
              f"the image directory amd-{arch} derives from the pack name"),
        table("gpu_targets.warpsize", "AOTRITON_ARCH_WARPSIZE", str(spec.warp_size), "wave size of the arch"),
        table("gpu_targets.production_line", "AOTRITON_ARCH_PRODUCTION_LINE", f"'{spec.production_line}'",
              "read by the kernel rules' tuning spaces (0.10b/0.11.x; removed in 0.12b)", optional=True),
        # anchored on the list of the arch's wave size, not on `like` (which may sit in the other list)
        EditRecord("compile.known_targets", p.compile, "python.seq_insert_first", f"KNOWN_TARGETS_{spec.warp_size}",
                   "[0]", f"'{arch}'", "argparse choices of the per-kernel compiler"),
    ]
    return out


def _cpp_tables(spec: TargetSpec, p: EditPaths) -> list[EditRecord]:
    like, arch = spec.registration.like, spec.arch
    like_hex, arch_hex = "0x" + like[3:], "0x" + arch[3:]
    out = []
    for gpu in spec.gpus:
        mod = gpu_mod(gpu)
        out.append(EditRecord(
            f"util_h.gpu_enum.{gpu}", p.util_h, "text.clone_line", "enum Gpu", f"GPU_AMD_ARCH_{like.upper()}_MOD0 ",
            {"substitute": [[f"{like.upper()}_MOD0", f"{arch.upper()}_MOD{mod}"],
                            [f"{like_hex}, 0)", f"{arch_hex}, {mod})"]]},
            "generated shims compare the runtime GPU against this enum"))
    out.append(EditRecord(
        "util_cc.classifier", p.util_cc, "text.clone_line", "DummyClassifier", f'"{like}",',
        {"substitute": [[f'"{like}"', f'"{arch}"'], [f"{like.upper()}_MOD0", f"{arch.upper()}_MOD0"]]},
        "maps the HIP arch name to the enum; without it check_gpu fails and PyTorch falls back"))
    if spec.registration.experimental:
        out.append(EditRecord(
            "util_cc.experimental", p.util_cc, "text.clone_line", "isArchExperimentallySupported",
            "vendor_arch == CAT32(GpuVendor::kAMD, 0x1101) ||", {"substitute": [["0x1101", arch_hex]]},
            "policy from the spec (registration.experimental)"))
    # second in the list, whichever arch comes first (anchored on the list, not on `like`'s place)
    out.append(EditRecord(
        "cmake.target_arch", p.cmake, "text.list_insert", "AOTRITON_TARGET_ARCH", 'set(AOTRITON_TARGET_ARCH "',
        {"item": arch, "index": 1, "sep": ";"}, "default arch list of a plain cmake configure"))
    return out


def edit_records(spec: TargetSpec, paths: EditPaths, hook_lines: list[str]) -> list[EditRecord]:
    """Every edit for `spec`, sorted by id. `hook_lines`: the rendered kdesc hook (emitted code)."""
    out = _python_tables(spec, paths) + _cpp_tables(spec, paths) + [
        EditRecord("kdesc.tuning_space_hook", paths.kdesc, "text.replace_line", "def gen_signatures_for_tuning",
                   "for cfg in self.gen_autotune_configs(f):", {"lines": list(hook_lines)},
                   "the target's tuning space comes from the generated module; other archs unchanged"),
        EditRecord("op_attn_fwd.head_dims", paths.op_attn_fwd,
                   "python.set_getenv_default_in_function" if paths.head_dims_function else "python.set_getenv_default",
                   paths.head_dims_function or HEAD_DIMS_ENV, f"'{HEAD_DIMS_ENV}'",
                   "'" + ", ".join(str(h) for h in spec.head_dims) + "'",
                   "a plain cmake && ninja install builds the spec's head dims; the env var still overrides"),
    ]
    ids = [e.id for e in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert not dup, f"duplicate edit ids: {dup}"  # a bug here, not a user error
    return sorted(out, key=lambda e: e.id)
