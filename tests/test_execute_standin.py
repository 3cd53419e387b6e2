"""Executed dispatch (codegen.ship.execute) end to end on a CPU in about a minute: the dispatch
driver and the stub HIP runtime in execute mode, the arena, the emulated gfx908 (codegen.emulate)
and the fp64 comparison, on a stand-in library of ours whose entry points launch naive Triton
attention kernels compiled for gfx908 (tests/exec_standin.py): every case passes; a planted
wrong scale fails out and lse by name; a wild output pointer is a fault report naming the kernel,
and the next case still runs. The real library's kernels: tests/test_execute_real.py."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from codegen.models.cases import Shape
from codegen.ship.dispatch import DispatchCase
from conftest import cached_sysroot

SYS6 = cached_sysroot(6)
pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(SYS6 is None or shutil.which("g++") is None or shutil.which("gcc") is None,
                       reason="needs gcc, g++ and the cached HIP 6 sysroot (tests/test_bundle_sysroot.py -m slow)"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton in this (test) venv"),
]

SHAPE = Shape(1, 2, 1, 13, 11)   # GQA 2:1, more queries than keys, lengths no power of two


def _case(dtype: str, causal: bool = False, bias: bool = False, tag: str = "") -> DispatchCase:
    name = f"{dtype}.d16.{'causal' if causal else 'full'}{'.bias' if bias else ''}{tag}"
    return DispatchCase(name, dtype, 16, causal, SHAPE, bias=bias)


@pytest.fixture(scope="module")
def standin(tmp_path_factory, pristine_tree):
    from codegen.emulate.source import EmulatorMissing, emulator_root
    from codegen.ship.stub import build_stub
    from exec_standin import build_standin
    from test_bundle_units import aks2

    try:
        emulator_root()
    except EmulatorMissing as exc:
        pytest.skip(f"emulator: {exc}")
    root, cache = tmp_path_factory.mktemp("bundle"), tmp_path_factory.mktemp("cache")
    stub = build_stub(SYS6.include, SYS6.runtime, cache / "stub")
    lib = build_standin(root, pristine_tree("0.11b"), SYS6, stub, aks2)
    return root, lib, stub, cache


def _run(standin, cases, monkeypatch, mode: str = ""):
    from codegen.ship.execute import run_execute

    root, lib, stub, cache = standin
    monkeypatch.setenv("MI100_FAKE_IMAGES", str(root / "co"))
    monkeypatch.setenv("MI100_FAKE_MODE", mode)
    lines = []
    rep = run_execute(lib=lib, prefix=root, images=root / "lib" / "aotriton.images", hip_include=SYS6.include,
                      stub=stub, arch="gfx908", target="gfx908:sramecc+:xnack-", cases=cases, cache=cache / "driver",
                      progress=lines.append, timeout=900)
    print("\n" + "\n".join(lines))
    return rep


def test_every_case_executes_and_matches_fp64(standin, monkeypatch):
    cases = [_case("fp16"), _case("bf16", causal=True), _case("fp16", bias=True)]
    rep = _run(standin, cases, monkeypatch)
    assert rep.ok, rep.model_dump_json(indent=1)[:4000]
    assert [c.case for c in rep.cases] == [c.name for c in cases]
    for c in rep.cases:
        names = {t.name for t in c.tensors}
        assert names == ({"out", "lse", "dq", "dk", "dv"} | ({"db"} if c.bias else set())), names
        assert all(0 <= t.error <= t.tolerance for t in c.tensors)
        ran = {(k.phase, k.kernel) for k in c.kernels}
        d = c.dtype
        assert ran == {("fwd", f"amd-gfx908/flash/naive_fwd/F__{d}/naive_fwd-Sig-F__{d}"),
                       ("bwd", f"amd-gfx908/flash/naive_dkdv/F__{d}/naive_dkdv-Sig-F__{d}"),
                       ("bwd", f"amd-gfx908/flash/naive_dq/F__{d}/naive_dq-Sig-F__{d}")}, ran
        fwd = next(k for k in c.kernels if k.phase == "fwd")
        assert fwd.launches == 1 and fwd.waves == SHAPE.seqlen_q * SHAPE.heads_q and fwd.instructions > 0
    assert rep.packed_kernels == 6 and len(rep.opcodes) == 6
    for o in rep.opcodes:
        assert o.executed and set(o.executed) <= set(o.present), o
        assert "s_endpgm" in o.executed


def test_a_wrong_scale_fails_out_and_lse(standin, monkeypatch):
    rep = _run(standin, [_case("fp16")], monkeypatch, mode="scale")
    assert not rep.ok
    (c,) = rep.cases
    bad = {t.name for t in c.tensors if not t.ok}
    assert {"out", "lse"} <= bad and c.fault is None and c.fwd == 0 and c.bwd == 0, c


def test_a_wild_pointer_is_a_fault_and_the_next_case_runs(standin, monkeypatch):
    rep = _run(standin, [_case("fp16", tag=".wild"), _case("bf16")], monkeypatch, mode="wild")
    wild, nxt = rep.cases
    assert not rep.ok and not wild.ok and wild.fault is not None, wild
    assert wild.fault.phase == "fwd" and wild.fault.kernel.endswith("naive_fwd-Sig-F__fp16"), wild.fault
    assert wild.fwd == 719 and not wild.tensors             # hipErrorLaunchFailure, returned by the library
    dkdv = [k for k in wild.kernels if "naive_dkdv" in k.kernel]
    assert dkdv and all(k.instructions == 0 for k in dkdv)  # launched after the fault: answered, not executed
    assert nxt.ok, nxt                                      # the Machine goes on after a fault
