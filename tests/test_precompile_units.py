"""precompile's pure parts: resource parsing, occupancy, verdicts, sampling, cache keys, pruning,
reports (fast; no Triton, no AOTriton tree)."""

from __future__ import annotations

import json
import struct
import sys

import pytest

from codegen.models import KernelConfig, expand_space
from codegen.models.limits import CompileReport, CompileReportEntry, largest_clean_waves_per_eu, waves_per_eu_limits
from codegen.plan.kernel_list import KernelEntry, config_of
from codegen.compile.cache import kernel_ident, source_hash
from codegen.compile.prune import (
    compile_report,
    prune_rules,
    prune_spec,
)
from codegen.compile.report import KernelResult, RunInfo, precompile_report, report_json, report_markdown
from codegen.compile.resources import (
    Resources,
    occupancy,
    parse_resources,
    text_section_size,
    waves_per_eu_bound,
)
from codegen.compile.sample import stratified_sample
from codegen.compile.worker import first_error_line
from codegen.formats.spec import load_spec


@pytest.fixture(scope="module")
def loaded():
    return load_spec(None)


def _elf(text_size: int, meta: dict | None = None) -> bytes:
    """A minimal ELF64 LE code object: null, .text, .shstrtab and (with `meta`) an AMDGPU
    metadata note (type 32, msgpack) the way LLVM writes it."""
    import msgpack

    names = b"\0.text\0.shstrtab\0.note\0"
    text = b"\0" * text_size
    note = b""
    if meta is not None:
        desc = msgpack.packb(meta)
        note = struct.pack("<III", 7, len(desc), 32) + b"AMDGPU\0\0" + desc + b"\0" * (-len(desc) % 4)
    shoff = 64 + len(text) + len(names) + len(note)
    nsec = 4 if note else 3
    hdr = bytearray(64)
    hdr[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", hdr, 0x28, shoff)
    struct.pack_into("<HHH", hdr, 0x3A, 64, nsec, 2)

    def sh(name, typ, off, size, align=1):
        return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, 0, 0, align, 0)

    heads = sh(0, 0, 0, 0) + sh(1, 1, 64, text_size) + sh(7, 3, 64 + text_size, len(names))
    if note:
        heads += sh(17, 7, 64 + text_size + len(names), len(note), 4)
    return bytes(hdr) + text + names + note + heads


ASM = """\t.text
kernel:
\tv_mfma_f32_32x32x8f16 a[0:15], v[0:1], v[2:3], a[0:15]
\tv_mfma_f32_32x32x8f16 a[0:15], v[0:1], v[2:3], a[0:15]
\tv_mov_b32 v1, v2 ; not v_mfma
\ts_endpgm
; Kernel info:
; codeLenInByte = 8852
; Occupancy: 3
"""
NOTE = {".name": "kernel", ".agpr_count": 9, ".group_segment_fixed_size": 0, ".private_segment_fixed_size": 16,
        ".sgpr_count": 104, ".sgpr_spill_count": 61, ".vgpr_count": 72, ".vgpr_spill_count": 0,
        ".wavefront_size": 64}
LLIR = 'attributes #0 = { "amdgpu-flat-work-group-size"="1,256" "amdgpu-waves-per-eu"="2,2" }'


def test_parse_resources_and_text_size():
    r = parse_resources(ASM, _elf(1234, {"amdhsa.version": [1, 2], "amdhsa.kernels": [NOTE]}), shared=2048)
    assert r == Resources(vgprs=72, agprs=9, sgprs=104, lds_bytes=2048, scratch_bytes=16, vgpr_spills=0,
                          sgpr_spills=61, mfma=2, code_bytes=1234, llvm_occupancy=3, wavefront_size=64)
    assert text_section_size(b"not an elf") == 0


def test_parse_resources_without_agpr_file_and_wave32():
    """gfx906 (no AGPRs: no .agpr_count) and a wave32 arch read the same way."""
    note = {k: v for k, v in NOTE.items() if k != ".agpr_count"} | {".wavefront_size": 32}
    r = parse_resources(ASM, _elf(16, {"amdhsa.kernels": [note]}), shared=0, llir=LLIR)
    assert (r.agprs, r.wavefront_size, r.max_waves_per_eu) == (0, 32, 2)


def test_parse_resources_requires_metadata():
    with pytest.raises(ValueError, match="not an ELF"):
        parse_resources("s_endpgm\n", b"", 0)
    with pytest.raises(ValueError, match="no AMDGPU metadata note"):
        parse_resources("s_endpgm\n", _elf(4), 0)
    note = {k: v for k, v in NOTE.items() if k != ".vgpr_count"}
    with pytest.raises(ValueError, match="vgpr_count"):
        parse_resources("s_endpgm\n", _elf(4, {"amdhsa.kernels": [note]}), 0)


def test_waves_per_eu_bound_as_llvm_reads_it():
    assert waves_per_eu_bound('"amdgpu-waves-per-eu"="2,2"') == 2      # Triton 3.8
    assert waves_per_eu_bound('"amdgpu-waves-per-eu"="2,10"') == 10    # Triton 3.5
    assert waves_per_eu_bound('"amdgpu-waves-per-eu"="1"') is None     # no upper bound
    assert waves_per_eu_bound('"amdgpu-waves-per-eu"="0"') is None     # invalid: ignored
    assert waves_per_eu_bound('"amdgpu-waves-per-eu"="3,2"') is None   # invalid: ignored
    assert waves_per_eu_bound("") is None


def _res(**kw) -> Resources:
    base = dict(vgprs=72, agprs=9, sgprs=104, lds_bytes=2048, scratch_bytes=0, vgpr_spills=0, sgpr_spills=0,
                mfma=4, code_bytes=100)
    base.update(kw)
    return Resources(**base)


def test_occupancy_gfx908_limits(loaded):
    hw = loaded.spec.hardware
    assert occupancy(hw, _res(), 4) == (3, "VGPRs")                   # 256 // 72 (LLVM says 3 too)
    assert occupancy(hw, _res(vgprs=24, sgprs=58, lds_bytes=0), 4) == (10, "wave slots")
    assert occupancy(hw, _res(vgprs=24, sgprs=90, lds_bytes=0), 4) == (8, "SGPRs")
    assert occupancy(hw, _res(vgprs=24, sgprs=58, lds_bytes=40000), 4) == (1, "LDS")
    assert occupancy(hw, _res(vgprs=24, agprs=130, sgprs=58, lds_bytes=0), 4) == (1, "AGPRs")
    unified = hw.model_copy(update={"unified_register_file": True, "vgprs_per_lane": 512})
    assert occupancy(unified, _res(vgprs=128, agprs=128, sgprs=58, lds_bytes=0), 4) == (2, "VGPRs")
    # the kernel's waves-per-eu upper bound caps LLVM's estimate (Triton 3.8 writes "N,N")
    assert occupancy(hw, _res(vgprs=24, sgprs=58, lds_bytes=0, max_waves_per_eu=2), 4) == (2, "waves_per_eu")
    assert occupancy(hw, _res(max_waves_per_eu=10), 4) == (3, "VGPRs")
    # no SGPR table (gfx10+: SGPRs are per wave) -> SGPRs do not limit occupancy
    no_sgpr_limit = hw.model_copy(update={"sgpr_occupancy": None})
    assert occupancy(no_sgpr_limit, _res(vgprs=24, sgprs=104, lds_bytes=0, wavefront_size=32), 4) == (10, "wave slots")


def test_occupancy_reads_the_arch_traits():
    from codegen.formats.spec import load_spec

    gfx906 = load_spec("rules/mi50.yaml").spec.hardware
    gfx1030 = load_spec("rules/rdna2.yaml").spec.hardware
    # gfx906: no AGPR file (agprs 0), gfx9 SGPR steps, 10 slots, granule 4
    assert occupancy(gfx906, _res(vgprs=24, agprs=0, sgprs=58, lds_bytes=0), 4) == (10, "wave slots")
    assert occupancy(gfx906, _res(vgprs=24, agprs=0, sgprs=86, lds_bytes=0), 4) == (9, "SGPRs")
    assert occupancy(gfx906, _res(vgprs=100, agprs=0, sgprs=58, lds_bytes=0), 4) == (2, "VGPRs")
    # gfx1030 wave32: a 1024-VGPR file, granule 16, 16 slots, SGPRs never limit
    assert occupancy(gfx1030, _res(vgprs=24, agprs=0, sgprs=106, lds_bytes=0), 8) == (16, "wave slots")
    assert occupancy(gfx1030, _res(vgprs=100, agprs=0, sgprs=106, lds_bytes=0), 8) == (9, "VGPRs")  # 1024 // 112
    assert occupancy(gfx1030, _res(vgprs=256, agprs=0, sgprs=106, lds_bytes=0), 8) == (4, "VGPRs")
    # a workgroup asking more LDS than one workgroup may allocate does not fit at all
    assert occupancy(gfx1030, _res(vgprs=24, agprs=0, lds_bytes=70000), 8) == (0, "LDS")


def test_vgpr_budget_is_capped_by_what_one_wave_addresses():
    from codegen.compile.descend import vgpr_budget
    from codegen.formats.spec import load_spec

    gfx1030 = load_spec("rules/rdna2.yaml").spec.hardware
    gfx906 = load_spec("rules/mi50.yaml").spec.hardware
    assert [vgpr_budget(gfx1030, w) for w in (1, 4, 5, 8)] == [256, 256, 192, 128]
    assert [vgpr_budget(gfx906, w) for w in (1, 2, 3)] == [256, 128, 84]


def _result(config="attn_fwd.gfx908.fp16.d64.M128N64.wpe2.w4.s1.plv0", status="ok", wpe=2, occ=3, **res) -> KernelResult:
    family, _, dtype, d = config.split(".")[:4]
    return KernelResult(id=f"{config}#{res.get('code_bytes', 0)}", config=config, family=family, dtype=dtype,
                        head_dim=int(d[1:]), waves_per_eu=wpe, num_warps=4, num_stages=1, status=status,
                        error=None if status == "ok" else "CompilationError: boom",
                        resources=_res(**res) if status == "ok" else None, occupancy=occ if status == "ok" else None)


def test_verdicts():
    assert _result().verdicts == ["ok"]
    assert _result(vgpr_spills=3).verdict == "spills"
    assert _result(occ=1).verdicts == ["low occupancy"]
    assert _result(mfma=0).verdicts == ["no matrix cores"]
    assert _result(status="failed").verdict == "failed"
    assert _result(occ=1, vgpr_spills=2).verdicts == ["low occupancy", "spills"]
    assert _result(wpe=0, occ=1).verdicts == ["ok"]  # no occupancy request, nothing to miss


def test_dot_instruction_mix_and_matrix_core_expectation():
    from codegen.compile.report import expected_matrix, summaries
    from codegen.formats.spec import load_spec

    asm = "\tv_dot2_f32_f16 v1, v2, v3, v1\n\tv_dot2c_f32_f16 v1, v2, v3\n\tv_fmac_f32_e32 v4, v5, v6\n" \
          "\tv_fma_f32 v4, v5, v6, v7\n\tv_pk_fma_f32 v[0:1], v[2:3], v[4:5], v[0:1]\n\tv_wmma_f32_16x16x16_f16 v[0:7], v[8:15], v[16:23], v[0:7]\n"
    note = {k: v for k, v in NOTE.items() if k != ".agpr_count"}
    r = parse_resources(asm, _elf(16, {"amdhsa.kernels": [note]}), shared=0)
    assert (r.mfma, r.wmma, r.dot2, r.fma, r.dot_instruction) == (0, 1, 2, 3, "wmma")
    assert _res(mfma=0).dot_instruction == "none"
    assert _res(mfma=0, dot2=5, fma=9).dot_instruction == "dot2"
    gfx906 = load_spec("rules/mi50.yaml").spec.hardware
    gfx908 = load_spec("rules/mi100.yaml").spec.hardware
    assert expected_matrix(gfx906, "fp16") is None and expected_matrix(gfx908, "bf16") == "mfma"
    # no matrix cores on the arch: a kernel without MFMA is not flagged
    plain = _result(mfma=0, dot2=12).model_copy(update={"expected_matrix": None})
    assert plain.verdicts == ["ok"]
    # a WMMA arch expects v_wmma*: MFMA count is beside the point
    assert _result(mfma=0, wmma=3).model_copy(update={"expected_matrix": "wmma"}).verdicts == ["ok"]
    assert _result(mfma=4, wmma=0).model_copy(update={"expected_matrix": "wmma"}).verdicts == ["no matrix cores"]
    mix = summaries([plain, _result(mfma=0, fma=7).model_copy(update={"expected_matrix": None})])
    assert mix["by_family"]["attn_fwd"].dot_instructions == "dot2:1 fma:1"


def _entry(family="attn_fwd", dtype="fp16", hd=64, m=64, n=32, wpe=2, plv=False, i=0) -> KernelEntry:
    plv = plv if family == "attn_fwd" else None
    cfg = config_of(family, "gfx908", dtype, hd, m, n, wpe, 4, 1, plv)
    return KernelEntry(id=f"{family}-{dtype}-{hd}-{m}-{n}-{wpe}-{i}", config=cfg, hsaco=f"x/{i}.hsaco",
                       source="tritonsrc/flash.py", kernel_name=family, signature="*fp16:16", perf="", functional="")


def test_stratified_sample_covers_and_is_deterministic():
    entries = [_entry(f, dt, hd, wpe=w, i=i) for f in ("attn_fwd", "bwd_kernel_dq", "bwd_kernel_dk_dv")
               for dt in ("fp16", "bf16", "fp32") for hd in (32, 64) for w in (1, 2) for i in range(3)]
    s = stratified_sample(entries, 4)
    assert len(s) == 4
    assert {e.config.family for e in s} == {"attn_fwd", "bwd_kernel_dq", "bwd_kernel_dk_dv"}
    assert {e.config.dtype for e in s} == {"fp16", "bf16", "fp32"} and {e.config.head_dim for e in s} == {32, 64}
    assert stratified_sample(list(reversed(entries)), 4) == s
    s18 = stratified_sample(entries, 18)  # one per stratum
    assert len({(e.config.family, e.config.dtype, e.config.head_dim) for e in s18}) == 18
    s36 = stratified_sample(entries, 36)  # configs take turns inside a stratum
    assert len({e.config.name for e in s36}) == 36
    assert stratified_sample(entries, 0) == stratified_sample(entries, len(entries))


def test_cache_key(tmp_path):
    """The key is the sha256 of what decides the code object (the roundtrip: tests/test_kcache.py)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "k.py").write_text("x = 1\n")
    kw = dict(source=str(tmp_path / "src" / "k.py"), kernel_name="k", signature="*fp16:16, 32", num_warps=4,
              num_stages=1, waves_per_eu=2, arch="gfx908", warp_size=64, triton_version="3.5.1")
    key = kernel_ident(**kw).key
    assert key == kernel_ident(**{**kw, "signature": "*fp16:16,32"}).key
    assert kernel_ident(**kw).signature == "*fp16:16,32"
    for change in ({"signature": "*bf16:16, 32"}, {"waves_per_eu": 1}, {"triton_version": "3.6.0"}, {"arch": "gfx90a"}):
        assert kernel_ident(**{**kw, **change}).key != key


def test_source_hash_covers_the_import_closure_only(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.py").write_text("import triton\nfrom helper import f\n")
    (src / "helper.py").write_text("from .deep import g\n")
    (src / "deep.py").write_text("g = 1\n")
    (src / "test_k.py").write_text("import k\n")
    (src / "other.py").write_text("x = 1\n")
    before = source_hash(str(src / "k.py"))
    (src / "test_k.py").write_text("import k  # a test changed\n")
    (src / "other.py").write_text("x = 2\n")
    (src / "new_tool.py").write_text("y = 1\n")
    source_hash.cache_clear()
    assert source_hash(str(src / "k.py")) == before  # files the kernel never imports don't count
    (src / "deep.py").write_text("g = 2\n")
    source_hash.cache_clear()
    assert source_hash(str(src / "k.py")) != before  # a transitive import does


def test_prune_spec_excludes_failing_and_spilling_configs(loaded, tmp_path):
    spilling = _entry("attn_fwd", "fp16", 64, 128, 64, wpe=1)
    failing = _entry("bwd_kernel_dq", "bf16", 32, 64, 32, wpe=2)
    clean = _entry("bwd_kernel_dq", "bf16", 32, 32, 16, wpe=2)
    outside = _entry("attn_fwd", "fp16", 64, 16, 16, wpe=2)  # not in the spec's space
    space = {c.name for cfgs in expand_space(loaded.spec).values() for c in cfgs}
    assert {spilling.config.name, failing.config.name, clean.config.name} <= space
    assert outside.config.name not in space
    results = [_result(spilling.config.name, wpe=1, vgpr_spills=12), _result(failing.config.name, status="failed"),
               _result(clean.config.name), _result(outside.config.name, vgpr_spills=1)]
    rules, out_of_space = prune_rules(loaded, [spilling, failing, clean, outside], results, "3.5.1")
    assert out_of_space == [outside.config.name]
    assert sorted(rules) == ["attn_fwd", "bwd_kernel_dq"]
    assert "spills 12 VGPRs with Triton 3.5.1" in rules["attn_fwd"][0]["reason"]
    dest = tmp_path / "pruned.yaml"
    assert prune_spec(loaded, rules, dest) == 2
    assert prune_spec(load_spec(dest), rules, dest) == 0  # idempotent
    text = dest.read_text()
    import difflib

    original = loaded.path.read_text().splitlines()
    removed = [ln for ln in difflib.ndiff(original, text.splitlines()) if ln.startswith("- ")]
    assert removed == [], removed  # only lines added: comments and layout kept
    assert "# Head dims to build." in text
    pruned = load_spec(dest)
    names = {c.name for cfgs in expand_space(pruned.spec).values() for c in cfgs}
    assert spilling.config.name not in names and failing.config.name not in names and clean.config.name in names
    assert len(names) == len(space) - 2


def test_compile_report_and_largest_clean_waves():
    results = [_result("attn_fwd.gfx908.fp16.d64.M128N64.wpe2.w4.s1.plv0", vgpr_spills=8),
               _result("attn_fwd.gfx908.fp16.d64.M128N64.wpe1.w4.s1.plv0", wpe=1, occ=1),
               _result("attn_fwd.gfx908.fp16.d64.M64N64.wpe3.w4.s1.plv0", wpe=3, occ=3)]
    rep = compile_report(results, arch="gfx908", gpu="gfx908_mod0", release="0.11b", triton="3.5.1")
    assert rep.configs["attn_fwd.gfx908.fp16.d64.M128N64.wpe2.w4.s1.plv0"].verdict == "spills"
    assert CompileReport.model_validate_json(rep.model_dump_json()) == rep
    cfg = KernelConfig("attn_fwd", "gfx908", "fp16", 64, 128, 64, 4, 4, 1, False)
    limits = waves_per_eu_limits(rep, "gfx908")
    assert largest_clean_waves_per_eu(limits, cfg) == 1
    cfg64 = KernelConfig("attn_fwd", "gfx908", "fp16", 64, 64, 64, 2, 4, 1, False)
    assert largest_clean_waves_per_eu(limits, cfg64) is None  # only wpe3 known, above the request
    merged = compile_report([], arch="gfx908", gpu="gfx908_mod0", release="0.11b", triton="3.5.1", previous=rep)
    assert merged.configs == rep.configs
    other = compile_report([], arch="gfx908", gpu="gfx908_mod0", release="0.11b", triton="3.6.0", previous=rep)
    assert other.configs == {}


def test_report_is_deterministic_and_renders_markdown():
    results = [_result(), _result(vgpr_spills=2, code_bytes=5), _result(status="failed", code_bytes=7)]
    info = RunInfo(gpu="gfx908_mod0", arch="gfx908", release="0.11b", triton="3.5.1", build="normal",
                   planned=10, sampled=3, sample=3, jobs=2, wall_s=6.0, compiled_now=3, from_cache=0)
    rep = precompile_report(info, results)
    assert report_json(rep) == report_json(precompile_report(info, list(reversed(results))))
    assert rep.totals.failed == 1 and rep.totals.spilling == 1
    assert rep.run.kernels_per_min == 30.0
    doc = json.loads(report_json(rep))
    assert set(doc) == {"by_family", "by_head_dim", "by_dtype", "by_config", "kernels", "totals", "run"}
    assert [k["verdicts"] for k in doc["kernels"]] == [k.verdicts for k in rep.kernels]
    md = report_markdown(rep)
    assert "## By config" in md and "## Failures" in md and "CompilationError: boom" in md


def test_first_error_line():
    exc = RuntimeError("at 3:4:\ndef k(A):\n    x = y\n        ^\nNameError('y is not defined')")
    assert first_error_line(exc) == "RuntimeError: NameError('y is not defined')"
    assert first_error_line(RuntimeError("at 1:2:\nboom\nmore")) == "RuntimeError: boom"
    assert first_error_line(ValueError("")) == "ValueError"


def test_toolchain_refuses_a_triton_outside_the_spec(monkeypatch):
    """precompile/build/tune: one message naming the spec's Triton and the build-venv fix (exit 3)."""
    from codegen.core.errors import EnvironmentMissing
    from codegen.compile import engine
    from codegen.formats.spec import load_spec
    from codegen.toolchain import require_triton, triton_mismatch

    gfx906, gfx908 = load_spec("rules/mi50.yaml").spec, load_spec("rules/mi100.yaml").spec
    assert triton_mismatch(gfx908, "3.5.1") is None and triton_mismatch(gfx906, "3.8.0") is None
    assert "does not compile AOTriton's kernels for gfx906" in triton_mismatch(gfx906, "3.5.1")
    assert "no Triton installed" in triton_mismatch(gfx906, None)
    with pytest.raises(EnvironmentMissing) as ei:
        require_triton(gfx906, "3.5.0+rocm7.1", "precompile", "/opt/torch/bin/python")
    assert ei.value.exit_code == 3
    assert "'>=3.8.0,<3.9'" in str(ei.value) and "/opt/torch/bin/python" in str(ei.value)
    assert "leave out --python" in ei.value.hint and "'triton>=3.8.0,<3.9'" in ei.value.hint
    assert "never pip install triton into the torch environment" in ei.value.hint
    # an explicit interpreter is probed (read-only) and refused the same way; nothing is created
    from codegen.toolchain import interpreter

    monkeypatch.setattr(interpreter, "probe", lambda _py: {"triton": "3.5.1", "python": list(sys.version_info[:2])})
    monkeypatch.setattr(interpreter, "ensure_venv", lambda *a, **k: pytest.fail("no venv with --python"))
    with pytest.raises(EnvironmentMissing, match="gfx906") as ei:
        interpreter.compiler_python(gfx906, "precompile", python=sys.executable)
    assert ei.value.exit_code == 3 and "leave out --python" in ei.value.hint
    got = interpreter.compiler_python(gfx908, "precompile", python=sys.executable)
    assert (got.triton, got.origin, got.is_current) == ("3.5.1", "--python", True)
    assert engine.triton_version(got) == "3.5.1"


def test_not_dispatched_fused_kernels_are_reported_as_such():
    """rows.split_backward: the fused backward kernels of a routed pass still compile (upstream compiles
    every backend) and keep their figures, but their verdict is 'not dispatched', not 'spills', and
    neither the spilling count nor the limits table treats them as spilling. Without an op database
    (0.10b) nothing is routed, so they stay what they are."""
    from codegen.compile import precompile as prun
    from codegen.upstream import by_release

    fuse = "bwd_kernel_fuse.gfx1030.bf16.d64.M16N16.wpe1.w8.s1"
    dq = "bwd_kernel_dq.gfx1030.bf16.d64.M16N16.wpe1.w8.s1"
    results = [_result(fuse, wpe=1, occ=4, vgpr_spills=16), _result(dq, wpe=1, occ=4, vgpr_spills=5),
               _result(fuse.replace("bf16", "fp16"), wpe=1, occ=4)]
    spec = load_spec("rules/rdna2.yaml").spec
    marked = prun.mark_not_dispatched(results, spec, by_release("0.11b"))
    assert [r.verdicts for r in marked] == [["not dispatched"], ["spills"], ["ok"]]
    assert marked[0].resources.vgpr_spills == 16  # the figures stay
    info = RunInfo(gpu="gfx1030_mod0", arch="gfx1030", release="0.11b", triton="3.5.1", build="normal", planned=3,
                   sampled=3, sample=0, jobs=1, wall_s=1.0, compiled_now=3, from_cache=0)
    tot = precompile_report(info, marked).totals
    assert tot.spilling == 1 and tot.not_dispatched == 1
    limits = waves_per_eu_limits(CompileReport(arch="gfx1030", gpu="gfx1030_mod0", release="0.11b", triton="3.5.1", configs={
        fuse: CompileReportEntry(verdict="not dispatched", kernels=1)}), "gfx1030")
    assert largest_clean_waves_per_eu(limits, KernelConfig.parse(fuse)) == 1

    assert [r.verdicts for r in prun.mark_not_dispatched(results, spec, by_release("0.10b"))] == [["spills"], ["spills"], ["ok"]]
