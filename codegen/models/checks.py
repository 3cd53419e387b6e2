"""Cross-field validation of a TargetSpec (pure). Returns diagnostics with their field paths,
so the loader can point each at `file:line:col`."""

from __future__ import annotations

from dataclasses import dataclass

from codegen.models.archs import LLVM_AMDGPU_TARGETS
from codegen.models.space import expand_family
from codegen.models.target import DTYPE_BYTES, FAMILIES, GPU_RE, TargetSpec, tile_problems

Path = tuple[str | int, ...]

# Upstream rules express the head dim as a BLOCK_DMODEL constexpr list (default 16..512 in
# steps that are multiples of 16); the runtime pads other head dims up to the next one.
HEAD_DIM_STEP = 16
HEAD_DIM_MAX = 512


@dataclass(frozen=True, order=True)
class Diagnostic:
    path: Path
    message: str
    severity: str = "error"  # or "warning"


def _lds_lower_bound(block_m: int, block_n: int, head_dim: int, dtype: str) -> int:
    # Whatever the kernel, one operand tile of max(M, N) rows x head_dim must be staged in LDS
    # for the matrix product; a config whose lower bound already exceeds the LDS can't compile.
    return max(block_m, block_n) * head_dim * DTYPE_BYTES[dtype]


def check_target(spec: TargetSpec) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    err = lambda path, msg: out.append(Diagnostic(tuple(path), msg))  # noqa: E731
    warn = lambda path, msg: out.append(Diagnostic(tuple(path), msg, "warning"))  # noqa: E731
    _check_arch(spec, err, warn)
    _check_head_dims_and_dtypes(spec, err, warn)
    _check_rows_and_registration(spec, err)
    for family in FAMILIES:
        _check_tiles(spec, family, err)
        _check_family_axes(spec, family, err)
    return sorted(set(out), key=lambda d: (d.severity != "error", [str(p) for p in d.path], d.message))


def _check_arch(spec: TargetSpec, err, warn) -> None:
    steps = spec.hardware.sgpr_occupancy or []
    for i, (max_sgprs, _waves) in enumerate(steps[:-1]):  # the last step covers every count above
        if max_sgprs > spec.hardware.sgprs_per_wave:
            err(("hardware", "sgpr_occupancy", i),
                f"{max_sgprs} SGPRs exceed the {spec.hardware.sgprs_per_wave} a wave can address "
                "(hardware.sgprs_per_wave)")
    for path, arch in ((("arch",), spec.arch), (("registration", "like"), spec.registration.like)):
        if arch not in LLVM_AMDGPU_TARGETS:
            err(path, f"'{arch}' is not an AMDGPU target LLVM knows (e.g. gfx908, gfx90a, gfx942, gfx1100)")
    for i, gpu in enumerate(spec.gpus):
        m = GPU_RE.match(gpu)
        if m and m.group(1) != spec.arch:
            err(("gpus", i), f"GPU '{gpu}' does not belong to arch '{spec.arch}'")
    expected_warp = 64 if spec.production_line == "CDNA" else 32
    if spec.warp_size != expected_warp:
        err(("warp_size",), f"{spec.production_line} GPUs run wave{expected_warp}, not {spec.warp_size}")
    hw = spec.hardware
    if (hw.matrix_instructions == "mfma" and not hw.unified_register_file and hw.agprs_per_lane == 0
            and "fp16" in hw.matrix_core_dtypes):
        warn(("hardware", "agprs_per_lane"), "a split register file with MFMA normally has AGPRs")
    if hw.matrix_instructions == "none" and hw.matrix_core_dtypes:
        err(("hardware", "matrix_core_dtypes"),
            "matrix_instructions is 'none' (no matrix cores): matrix_core_dtypes must be []")
    if hw.matrix_instructions != "none" and not hw.matrix_core_dtypes:
        err(("hardware", "matrix_instructions"),
            f"'{hw.matrix_instructions}' names matrix cores but matrix_core_dtypes is empty "
            "(set matrix_instructions: none for an arch without them)")
    if hw.max_vgprs_per_wave is not None and hw.max_vgprs_per_wave > hw.vgprs_per_lane:
        err(("hardware", "max_vgprs_per_wave"),
            f"{hw.max_vgprs_per_wave} VGPRs per wave exceed the file of {hw.vgprs_per_lane} per lane")
    if hw.lds_bytes_per_workgroup is not None and hw.lds_bytes_per_workgroup > hw.lds_bytes_per_cu:
        err(("hardware", "lds_bytes_per_workgroup"),
            f"{hw.lds_bytes_per_workgroup} bytes of LDS per workgroup exceed the {hw.lds_bytes_per_cu} per CU")


def _check_head_dims_and_dtypes(spec: TargetSpec, err, warn) -> None:
    if sorted(spec.head_dims) != list(spec.head_dims):
        err(("head_dims",), "head dims must be listed in increasing order")
    if len(set(spec.head_dims)) != len(spec.head_dims):
        err(("head_dims",), "duplicate head dim")
    for i, hd in enumerate(spec.head_dims):
        if hd % HEAD_DIM_STEP:
            err(
                ("head_dims", i),
                f"head dim {hd} cannot be expressed by upstream's BLOCK_DMODEL axis "
                f"(multiples of {HEAD_DIM_STEP} up to {HEAD_DIM_MAX}); the runtime pads "
                f"{hd} up to {hd + HEAD_DIM_STEP - hd % HEAD_DIM_STEP} — list that instead",
            )
    if len(spec.head_dims) == 1:
        warn(
            ("head_dims",),
            "a single head dim is fine for normal builds, but upstream tuning builds "
            "(0.10b-0.12b) drop a one-value axis and crash: keep two for tuning builds",
        )
    for i, dt in enumerate(spec.dtypes):
        if dt not in spec.hardware.matrix_core_dtypes:
            warn(
                ("dtypes", i),
                f"{spec.arch} has no matrix-core instructions for {dt}: its kernels run on "
                "plain ALUs (slow)",
            )


def _check_rows_and_registration(spec: TargetSpec, err) -> None:
    if spec.rows.donor_gpu in spec.gpus:
        err(("rows", "donor_gpu"), "the donor GPU must be another GPU than the target's own")
    for i, rep in enumerate(spec.rows.tile_replacements):
        m, n = rep.to
        if m < n or m & (m - 1) or n & (n - 1):
            err(("rows", "tile_replacements", i, "to"),
                f"replacement tile [{m}, {n}] must be powers of two with BLOCK_M >= BLOCK_N")
        if (m, n) == (rep.block_m, rep.block_n) and rep.min_num_warps is None:
            err(("rows", "tile_replacements", i, "to"), "replacement tile equals the tile it replaces")
        if rep.min_num_warps is not None and rep.min_num_warps not in spec.family_space(rep.family).num_warps:
            err(("rows", "tile_replacements", i, "min_num_warps"),
                f"{rep.min_num_warps} warps is not one of tuning.{rep.family}.num_warps "
                f"{sorted(spec.family_space(rep.family).num_warps)}: the replaced rows would select configs "
                "outside the tuning space")
    for i, route in enumerate(spec.rows.split_backward):
        if route.dtype is not None and route.dtype not in spec.dtypes:
            err(("rows", "split_backward", i, "dtype"), f"{route.dtype} is not one of the spec's dtypes")
        if route.head_dim is not None and route.head_dim not in spec.head_dims:
            err(("rows", "split_backward", i, "head_dim"), f"{route.head_dim} is not one of the spec's head dims")
    for family, floor in spec.rows.min_num_warps.as_dict().items():
        allowed = spec.family_space(family).num_warps
        if floor not in allowed:
            err(("rows", "min_num_warps", family),
                f"{floor} warps is not one of tuning.{family}.num_warps {sorted(allowed)}: the raised "
                "rows would select configs outside the tuning space")
    if spec.registration.like == spec.arch:
        err(("registration", "like"), "registration must clone another arch's entries")


def _check_tiles(spec: TargetSpec, family: str, err) -> None:
    space = spec.family_space(family)
    base = ("tuning", family)
    seen: set[tuple[int, int]] = set()
    for i, (m, n) in enumerate(space.block_sizes):
        for problem in tile_problems(m, n):
            err(base + ("block_sizes", i), problem)
        if (m, n) in seen:
            err(base + ("block_sizes", i), f"duplicate tile [{m}, {n}]")
        seen.add((m, n))
        for dt in spec.dtypes:
            hd = max(spec.head_dims)
            need = _lds_lower_bound(m, n, hd, dt)
            if need > spec.hardware.workgroup_lds_bytes:
                err(
                    base + ("block_sizes", i),
                    f"tile [{m}, {n}] cannot fit the LDS at head dim {hd}, {dt}: needs at "
                    f"least {need} bytes > {spec.hardware.workgroup_lds_bytes}",
                )


def _check_family_axes(spec: TargetSpec, family: str, err) -> None:
    space = spec.family_space(family)
    base = ("tuning", family)
    hw = spec.hardware
    for axis in ("waves_per_eu", "num_warps", "num_stages"):
        vals = getattr(space, axis)
        if len(set(vals)) != len(vals):
            err(base + (axis,), f"duplicate value in {axis}")
    for i, w in enumerate(space.waves_per_eu):
        if w > hw.max_waves_per_simd:
            err(
                base + ("waves_per_eu", i),
                f"waves_per_eu={w} exceeds the {hw.max_waves_per_simd} wave slots per SIMD",
            )
    if family == "attn_fwd":
        if space.pre_load_v is None:
            err(base, "attn_fwd needs pre_load_v (list of booleans)")
        elif len(set(space.pre_load_v)) != len(space.pre_load_v):
            err(base + ("pre_load_v",), "duplicate value in pre_load_v")
    elif space.pre_load_v is not None:
        err(base + ("pre_load_v",), f"pre_load_v applies to attn_fwd only, not {family}")
    for j, rule in enumerate(space.exclude):
        if all(
            getattr(rule, k) is None
            for k in ("block_m", "block_n", "waves_per_eu", "num_warps", "num_stages",
                      "pre_load_v", "dtype", "head_dim", "min_tile_area")
        ):
            err(base + ("exclude", j), "an exclusion must name at least one field to match")
    for dt in spec.dtypes:
        for hd in spec.head_dims:
            if not expand_family(spec, family, dt, hd):
                err(base, f"exclusions leave no config for {dt}, head dim {hd}")
