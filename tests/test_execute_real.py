"""The real smoke bundle (AOTriton 0.11b, gfx908; built as tests/test_bundle_real.py builds it, or
MI100_TEST_BUNDLE) executed: the library's own attn_fwd and attn_bwd through its real dispatch,
every kernel run on the emulated gfx908 (codegen.emulate) and compared with fp64; and two planted
faults that the dispatch check passes and execution catches (tests/plant.py).

    pytest -m "build and slow" -s tests/test_execute_real.py

The whole executed matrix of the smoke spec (fp16 and bf16 × head dim 64 × full, causal, bias,
dropout, causal+dropout, bias+dropout) runs in `bundle check --execute`, and that of the smoke spec
with head dims 32 and 64 (built here from rules/examples/smoke.yaml, or MI100_TEST_BUNDLE_D32) in
`emulate`; the planted faults run one case each (`emulate --case`). Needs what
tests/test_bundle_real.py needs, clang and the pinned emulator; the faults also llvm-objdump."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from test_bundle_real import SMOKE, _cli, _python, applied_tree, bundle  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.build, pytest.mark.slow, pytest.mark.aotriton]
ONE = "fp16.d64.full.b1h2k1.*"     # the one case each planted fault runs (EXEC_SHAPE's)


@pytest.fixture(scope="module", autouse=True)
def _emulator():
    from codegen.emulate.source import EmulatorMissing, emulator_root

    try:
        emulator_root()
    except EmulatorMissing as exc:
        pytest.skip(f"emulator: {exc}")


@pytest.mark.timeout(1800)   # issue 35 item 6: the whole gfx908 matrix under 30 minutes
def test_bundle_check_executes_the_whole_matrix(bundle):  # noqa: F811
    from codegen.ship.execute import EXEC_SHAPE, EXEC_SHAPE_BIAS

    r = _cli("bundle", "check", str(bundle), "--execute", "--json", timeout=3600)
    print("\n" + r.stderr[-6000:])
    rep = json.loads(r.stdout)
    ex = rep["executed"]
    assert r.returncode == 0 and rep["ok"] and ex["ok"], r.stderr[-4000:]
    names = {c["case"] for c in ex["cases"]}
    want = {f"{d}.d64.{v}.{(EXEC_SHAPE_BIAS if 'bias' in v else EXEC_SHAPE).tag}" for d in ("fp16", "bf16")
            for v in ("full", "causal", "full.bias", "full.dropout", "causal.dropout", "full.bias.dropout")}
    assert names == want, names ^ want
    for c in ex["cases"]:
        got = {t["name"] for t in c["tensors"]}
        assert got == {"out", "lse", "dq", "dk", "dv"} | ({"db"} if c["bias"] else set()), (c["case"], got)
        assert all(t["ok"] and t["error"] <= t["tolerance"] for t in c["tensors"])
        assert c["dropout"] == 0 or c["mask"] == 0      # the mask came from the library's own kernel
    ran = {k["kernel"].split("/")[2] for c in ex["cases"] for k in c["kernels"]}
    assert "attn_fwd" in ran and ran & {"bwd_kernel_fuse", "bwd_kernel_dk_dv"}, ran
    assert "debug_simulate_encoded_softmax" in ran
    for o in ex["opcodes"]:
        assert o["present"] and set(o["executed"]) <= set(o["present"]), o["kernel"]
    assert "kernels executed on an emulated gfx908 ISA" in r.stderr


def _emulate(bundle, *extra):
    r = _cli("emulate", str(bundle), "--case", ONE, "--json", *extra, timeout=3600)
    print("\n" + r.stderr[-3000:])
    return r, json.loads(r.stdout) if r.stdout.strip() else None


@pytest.mark.skipif(shutil.which("llvm-objdump") is None, reason="needs llvm-objdump (the planted fault's decoder)")
def test_exp_turned_into_log_passes_dispatch_and_fails_execution(bundle, tmp_path):  # noqa: F811
    """Today's gap (issue 35): every v_exp_f32 of the forward kernels turned into v_log_f32, hashes
    fixed. `bundle check` passes it; executing one case fails it, naming out and lse."""
    from plant import exp_to_log, rewrite_bundle

    count = []

    def change(rel, entries, _all):
        if "/attn_fwd/" not in rel:
            return None
        out = []
        for e, img in entries:
            new, n = exp_to_log(img, tmp_path / "co")
            count.append(n)
            out.append((e, new))
        return out

    planted = tmp_path / bundle.name
    changed = rewrite_bundle(bundle, planted, change)
    assert changed and all(n > 0 for n in count), (changed, count)
    r = _cli("bundle", "check", str(planted), timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]                   # the gap execution closes
    r, rep = _emulate(planted)
    assert r.returncode == 3 and "Traceback" not in r.stderr
    (c,) = rep["cases"]
    bad = {t["name"] for t in c["tensors"] if not t["ok"]}
    assert {"out", "lse"} <= bad or c["fault"] is not None, c
    r, rep = _emulate(bundle)
    assert r.returncode == 0 and rep["ok"], r.stderr[-3000:]    # the same case of the genuine bundle


def test_a_swapped_kernel_passes_dispatch_and_fails_execution(bundle, tmp_path):  # noqa: F811
    """The fp16 forward package of the plain functional holds the bf16 build of the same functional
    (same kernel, same arguments, the launch fields that go with it: a repack's mix-up; each copy
    one e_ident padding byte apart, so none is a byte-copy of an image packed elsewhere, which the
    check would name by its hash). `bundle check` passes it; executing one case fails it."""
    from plant import rewrite_bundle

    def change(rel, entries, every):
        if "/attn_fwd/" not in rel or "fp16@16_F_F_0_0_" not in rel:
            return None
        donor_entry, donor = next(v for k, v in every.items() if "/attn_fwd/" in k and "bf16@16_F_F_0_0_" in k)[0]
        return [(e.__class__(name=e.name, image_size=len(donor), block_threads=donor_entry.block_threads,
                             shared_memory=donor_entry.shared_memory), donor[:15] + bytes([i + 1]) + donor[16:])
                for i, (e, _) in enumerate(entries)]

    planted = tmp_path / bundle.name
    assert rewrite_bundle(bundle, planted, change)
    r = _cli("bundle", "check", str(planted), timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    r, rep = _emulate(planted)
    assert r.returncode == 3 and "Traceback" not in r.stderr
    (c,) = rep["cases"]
    bad = {t["name"] for t in c["tensors"] if not t["ok"]}
    assert c["fault"] is None and {"out", "lse"} <= bad, c


def test_bias_with_grouped_heads_is_0_11b_s_caveat(bundle):  # noqa: F811
    """0.11b's backward reads, for every query head of a group, the bias of the KV head's index
    ('CAVEAT: bias is incompatible with GQA' in its bwd_kernel_dk_dv.py and bwd_kernel_fuse.py;
    0.12b takes the query head's): with 2 query heads on 1 KV head and a per-head bias, executed,
    the forward, dq and db are right and dk and dv wrong, in both backends (fp16: fused, bf16:
    split). The executed matrix gives bias cases as many KV heads as query heads."""
    from codegen.models.cases import Shape
    from codegen.ship.dispatch import DispatchCase
    from codegen.ship.execute import execute_bundle

    shape = Shape(1, 2, 1, 67, 45)
    cases = [DispatchCase(f"{d}.d64.full.bias.{shape.tag}", d, 64, False, shape, bias=True) for d in ("fp16", "bf16")]
    rep = execute_bundle(bundle, pick=lambda _matrix: cases, progress=print)
    for c in rep.cases:
        ok = {t.name: t.ok for t in c.tensors}
        assert c.fault is None and ok == {"out": True, "lse": True, "dq": True, "db": True, "dk": False, "dv": False}, c


@pytest.fixture(scope="module")
def bundle_d32(tmp_path_factory, pristine_tree) -> Path:
    """A smoke bundle with head dims 32 and 64 (the smoke spec's other axes): MI100_TEST_BUNDLE_D32,
    else built here (the kernel cache holds the head-dim-64 kernels after the smoke build)."""
    cached = os.environ.get("MI100_TEST_BUNDLE_D32")
    if cached:
        return Path(cached)
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("needs cmake and ninja (see tests/test_build_real.py)")
    work = tmp_path_factory.mktemp("d32")
    spec = work / "smoke-d32.yaml"
    text = SMOKE.read_text()
    assert "\nhead_dims: [64]\n" in text
    spec.write_text(text.replace("\nhead_dims: [64]\n", "\nhead_dims: [32, 64]\n"))
    tree = work / "tree"
    shutil.copytree(pristine_tree("0.11b"), tree, symlinks=True)
    assert _cli("apply", str(tree), "--spec", str(spec)).returncode == 0
    r = _cli("bundle", "build", str(tree), "--hip", "6", "--spec", str(spec), "--out", str(work / "out"), "--json",
             *_python())
    assert r.returncode == 0, r.stderr[-4000:]
    return Path(json.loads(r.stdout)["bundle"])


@pytest.mark.timeout(1800)   # issue 35 item 6: the whole gfx908 matrix under 30 minutes
def test_head_dims_32_and_64_execute_the_whole_matrix(bundle_d32):
    r = _cli("emulate", str(bundle_d32), "--json", timeout=1800)
    print("\n" + r.stderr[-5000:])
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["ok"], r.stderr[-4000:]
    cases = rep["cases"]
    assert len(cases) == 24 and {c["head_dim"] for c in cases} == {32, 64} and {c["dtype"] for c in cases} == {
        "fp16", "bf16"}
    assert all(c["ok"] and c["tensors"] for c in cases)
