"""Leaving out what no dispatch table selects (codegen.imagebuild.reach, issue 24 item 6), on real trees.

The default spec is applied to real 0.11b and 0.13b trees and their own generator writes the
lists and dispatch tables, as CMake runs it. The proof read by codegen.formats.op_table (the
functional numbering of `godel_number()` and the table of entries) is checked against a second,
independent reading of the same generator output: the tuned op-table files are named (0.11b) or
listed (0.13b, `optune.op_attn_bwd/manifest.nsv`) by their functional, in the same spelling as the
fused kernel's image packages, so a package must be left out exactly when its functional has no
tuned entry naming the fused backend. The 0.11b run goes through the build venv's hook
(compile_client), as `build` runs it; the lists it leaves are compared line by line with the
generator's own.

What is not here: a CMake build with these lists (tests/test_build_real.py, marked build) and the
emulated dispatch of a bundle built from them (tests/test_bundle_real.py).

Marked aotriton: needs the release trees and the generator's requirements (pandas, numpy)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.compile.client import REACH_ENV
from codegen.compile.service import install_client
from codegen.imagebuild.configure import REACH_MODULE
from codegen.imagebuild.reach import (KEPT_DIR, REACH_FILE, confirm_left_out, proven_reach, prune, read_reach,
                                      record_in_prefix, read_prefix_reach, unreachable)
from codegen.models.reach import LeftOut
from codegen.models.records import write_json
from codegen.plan.reach import plan_reach
from codegen.core.errors import UserError
from codegen.plan.kernel_list import generate_kernel_list
from codegen.formats.spec import load_spec
from codegen.formats.op_table import FUSED_FAMILY, read_bwd_op_table

pytestmark = pytest.mark.aotriton


@pytest.fixture(autouse=True)
def _generator_requirements():
    missing = [m for m in ("pandas", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the AOTriton generator needs {', '.join(missing)} in this Python")


def _applied(fresh_tree, tag: str):
    from codegen.apply.engine import apply_overlay

    loaded = load_spec(None)
    tree = fresh_tree(tag)
    apply_overlay(tree, loaded)
    return tree, loaded.spec


def _generate(tree: Path, spec, v3src: Path, python: str = sys.executable, env: dict | None = None):
    return generate_kernel_list(tree, list(spec.gpus), python, arch=spec.arch, keep_build_dir=v3src,
                                env={"AOTRITON_ENABLE_FP32": "1", **(env or {})})


def _lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln]


def _lut_names_fused(cc: Path, index: int) -> bool:
    text = cc.read_text(encoding="utf-8")
    lut = text[text.index("lut["):text.rindex("End of GPU")].split("=", 1)[1]
    return str(index) in re.findall(r"-?\d+", lut)


def _trivial_entries(flash: Path) -> set[str]:
    return set(re.findall(r"optune_op_attn_bwd__Trivial_(\w+)", (flash / "iface.op_attn_bwd.cc").read_text()))


def _hooked_venv(tmp_path: Path) -> str:
    """A venv like build's: it sees this interpreter's packages through a .pth file and carries the
    client, installed by its own .pth line (codegen.imagebuild.configure.prepare_venv)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    (Path(site) / "_caller.pth").write_text("\n".join(p for p in sys.path if p.endswith("-packages")) + "\n")
    install_client(Path(site), after_generator=REACH_MODULE)
    return str(py)


def test_011b_through_the_build_venv_hook(fresh_tree, tmp_path):
    tree, spec = _applied(fresh_tree, "0.11b")
    plain = tmp_path / "plain" / "v3src"
    _generate(tree, spec, plain)
    hooked = tmp_path / "hooked" / "v3src"
    entries = _generate(tree, spec, hooked, python=_hooked_venv(tmp_path), env={REACH_ENV: sys.executable})

    reach = read_reach(hooked.parent)
    assert reach is not None, "the hook did not run the pruner after the generator"
    assert reach.proven_by == "v3src/flash/iface.op_attn_bwd.cc" and reach.reason is None
    # what the tables say, read independently: the tuned op files carry the functional's name
    flash = plain / "flash"
    assert _trivial_entries(flash) == {"kMetro_TritonSplit"}   # no entry sends every input to the fused kernel
    fused_index = 1
    tuned = {p.stem: _lut_names_fused(p, fused_index) for p in (flash / "optune.op_attn_bwd").glob("*.cc")}
    clusters = [ln.split(";") for ln in _lines(plain / "Bare.cluster") if ln.split(";")[2] == FUSED_FAMILY]
    want = {f"{c[0]}/{c[1]}/{c[2]}/{c[3]}.aks2" for c in clusters if not tuned.get(c[3], False)}
    got = {p.image for p in reach.packages_left_out}
    assert got == want and len(got) == 36
    assert reach.fused_kernels == sum(len(c) - 4 for c in clusters) == 342
    left = {h for c in clusters if f"{c[0]}/{c[1]}/{c[2]}/{c[3]}.aks2" in want for h in c[4:]}
    assert reach.kernels_left_out == len(left) == 171

    # the lists CMake reads: the generator's own, less exactly those lines (paths differ by build dir)
    def norm(lines, root):
        return [ln.replace(str(root), "BUILD") for ln in lines]

    plain_compile = norm(_lines(plain / "Bare.compile"), plain)
    kept_compile = norm(_lines(hooked / "Bare.compile"), hooked)
    left_norm = {h.replace(str(plain), "BUILD") for h in left}
    assert kept_compile == [ln for ln in plain_compile if ln.split(";")[0] not in left_norm]
    assert len(entries) == len(plain_compile) - 171       # and what plan reads is the pruned list
    assert norm(_lines(hooked / "Bare.cluster"), hooked) == [
        ln for ln in norm(_lines(plain / "Bare.cluster"), plain)
        if "/".join(ln.split(";")[:4]) + ".aks2" not in want]
    # every other file the generator wrote is the same bytes (the hook changes nothing else)
    others = sorted(p.relative_to(plain) for p in plain.rglob("*") if p.is_file()
                    and p.name not in ("Bare.compile", "Bare.cluster"))
    assert others and all((hooked / r).read_bytes().replace(str(hooked).encode(), b"B")
                          == (plain / r).read_bytes().replace(str(plain).encode(), b"B") for r in others)


def test_a_hostile_package_name_touches_nothing(fresh_tree, tmp_path):
    """A generator (a tree) that names an image package outside the build folder: refused before
    any list is rewritten or any file removed, inside or outside."""
    from codegen.core.contain import Escape

    tree, spec = _applied(fresh_tree, "0.11b")
    v3src = tmp_path / "b" / "v3src"
    _generate(tree, spec, v3src)
    victim = tmp_path / "victim.aks2"
    victim.write_bytes(b"keep")
    reach, _, _ = plan_reach(v3src, tree)
    gone = reach.packages_left_out[0].image.split("/")          # arch/family/kernel/NAME.aks2
    lines = (v3src / "Bare.cluster").read_text().split("\n")
    i = next(n for n, ln in enumerate(lines) if ln.startswith(";".join(gone[:3]) + ";" + gone[3][:-5] + ";"))
    lines[i] = ";".join(["../../..", "..", "..", "victim"] + lines[i].split(";")[4:])
    (v3src / "Bare.cluster").write_text("\n".join(lines))
    before = {p: p.read_bytes() for p in v3src.glob("Bare.*") if p.is_file()}
    with pytest.raises(Escape):
        prune(v3src, tree)
    assert {p: p.read_bytes() for p in v3src.glob("Bare.*") if p.is_file()} == before
    assert victim.read_bytes() == b"keep" and read_reach(tmp_path / "b") is None


def test_013b_zip_members_and_rerun(fresh_tree, tmp_path):
    tree, spec = _applied(fresh_tree, "0.13b")
    v3src = tmp_path / "b" / "v3src"
    _generate(tree, spec, v3src)
    flash = v3src / "flash"
    table = read_bwd_op_table(flash)
    fused_index = 1
    assert table is not None and len(table.fused) == 96
    # independent reading: the tuned files' manifest lists every functional, in table order, with
    # the file a tuned entry has (a uniform entry has none: its table slot names the one backend)
    iface = (flash / "iface.op_attn_bwd.cc").read_text()
    slots = re.findall(r"&([\w:]+),", iface[iface.index("optune_table[]"):])[:96]
    picks = {}
    for i, ln in enumerate(_lines(flash / "optune.op_attn_bwd" / "manifest.nsv")):
        name, desc = ln.split("\0")[:2]
        cc = flash / "optune.op_attn_bwd" / name
        assert cc.is_file() == slots[i].endswith(f"__F{i}"), (i, slots[i], name)
        member = desc.removeprefix("#F;").split(";;")[0]
        picks[member] = _lut_names_fused(cc, fused_index) if cc.is_file() else slots[i].endswith("_kShim_BwdKernelFuse")
    assert len(picks) == 96 and any(s.endswith("_kShim_BwdKernelFuse") for s in slots)  # 0.13b has uniform fused entries
    tuned = picks
    zip_manifest = v3src / "aotriton.images" / "amd-gfx908" / "flash" / f"{FUSED_FAMILY}.nsv"
    members = [ln.split("\0")[1] for ln in _lines(zip_manifest)]
    want = {m for m in members if not tuned.get(m, False)}
    before = {p: p.read_bytes() for p in v3src.glob("Bare.*") if p.is_file()}

    reach = prune(v3src, tree)
    assert {p.member for p in reach.packages_left_out} == want and len(want) == 36
    assert {p.image for p in reach.packages_left_out} == {f"amd-gfx908/flash/{FUSED_FAMILY}.zip"}
    assert reach.kernels_left_out == 248 and reach.fused_kernels == 496
    kept = [ln.split("\0")[1] for ln in _lines(zip_manifest)]
    assert kept == [m for m in members if m not in want]
    # every .aks2 a zip still takes is built from a cluster line still there, and every hsaco of
    # those lines is still compiled; the other kernels' lines are untouched
    compiled = {f for ln in _lines(v3src / "Bare.compile") for f in ln.split(";") if f.endswith(".hsaco")}
    clusters = {f"{v3src}/aks2/{'/'.join(ln.split(';')[:3])}/{ln.split(';')[3]}.aks2": ln.split(";")[4:]
                for ln in _lines(v3src / "Bare.cluster")}
    for ln in _lines(v3src / "Bare.flatzip"):
        for aks2 in ln.split(";")[3:]:
            assert aks2 in clusters and set(clusters[aks2]) <= compiled
    assert (v3src / "Bare.compile").read_text().count(f"/{FUSED_FAMILY}-") == 248
    assert {ln for ln in _lines(v3src / "Bare.compile") if f"/{FUSED_FAMILY}-" not in ln} == {
        ln for ln in before[v3src / "Bare.compile"].decode().split("\n") if ln and f"/{FUSED_FAMILY}-" not in ln}
    # through the build venv's hook (0.13b's generator runs workers of itself: only the outermost
    # run may leave kernels out, once): the same lists and record as prune() on the plain output
    hooked = tmp_path / "hooked" / "v3src"
    _generate(tree, spec, hooked, python=_hooked_venv(tmp_path), env={REACH_ENV: sys.executable})
    for name in ("Bare.compile", "Bare.cluster", "Bare.flatzip", f"aotriton.images/amd-gfx908/flash/{FUSED_FAMILY}.nsv"):
        assert (hooked / name).read_text().replace(str(hooked.parent), "B") == (v3src / name).read_text().replace(
            str(v3src.parent), "B")
    assert read_reach(hooked.parent).to_json() == reach.to_json()
    # the record proven again from the kept lists; a planted attn_fwd member is refused
    assert proven_reach(v3src.parent, tree).to_json() == reach.to_json()
    fwd = next(m for m in _lines(v3src / "aotriton.images" / "amd-gfx908" / "flash" / "attn_fwd.nsv"))
    planted = LeftOut(image="amd-gfx908/flash/attn_fwd.zip", member=fwd.split("\0")[1], kernels=1, functional={})
    _plant(v3src.parent, reach, planted)
    with pytest.raises(UserError, match="lists amd-gfx908/flash/attn_fwd.zip member"):
        proven_reach(v3src.parent, tree)
    # re-running on the pruned lists leaves them as they are
    after = {p: p.read_bytes() for p in v3src.glob("Bare.*") if p.is_file()}
    again, files, stale = plan_reach(v3src, tree)
    assert again.kernels_left_out == 0 and not files and not stale
    assert {p: p.read_bytes() for p in v3src.glob("Bare.*") if p.is_file()} == after


def _plant(build: Path, reach, extra: LeftOut) -> None:
    """A valid record (the model's every rule holds) that also lists `extra` as left out."""
    planted = reach.model_copy(update={"packages_left_out": [*reach.packages_left_out, extra],
                                       "kernels_left_out": reach.kernels_left_out + extra.kernels})
    (build / REACH_FILE).write_bytes(write_json(planted))


def test_a_planted_record_is_never_believed(fresh_tree, tmp_path):
    """issue 30 item 5: a valid reach record listing a reachable bf16 attn_fwd package as left out
    is refused, below a build folder and in an install prefix alike: the record is computed again
    from the generator's output (the lists prune kept, the op table, the kernel sources)."""
    tree, spec = _applied(fresh_tree, "0.11b")
    build = tmp_path / "b"
    _generate(tree, spec, build / "v3src")
    reach = prune(build / "v3src", tree)
    assert reach.packages_left_out and (build / KEPT_DIR / "Bare.compile").is_file()
    assert unreachable(build, tree).to_json() == reach.to_json()
    assert proven_reach(build, tree).to_json() == reach.to_json()

    fwd = next(c for c in (ln.split(";") for ln in _lines(build / KEPT_DIR / "Bare.cluster"))
               if c[2] == "attn_fwd" and "bf16" in c[3])
    image = f"{'/'.join(fwd[:4])}.aks2"
    planted = LeftOut(image=image, member=None, kernels=len(fwd) - 4, functional=dict(reach.packages_left_out[0].functional, Q="bf16"))
    _plant(build, reach, planted)
    with pytest.raises(UserError, match=re.escape(f"lists {image} as left out")) as exc:
        proven_reach(build, tree)
    assert "--reconfigure" in exc.value.hint
    # one left-out package dropped from the record, or the kept lists gone: refused as well
    (build / REACH_FILE).write_bytes(write_json(reach.model_copy(update={"packages_left_out": reach.packages_left_out[1:]})))
    with pytest.raises(UserError, match="does not list"):
        proven_reach(build, tree)
    (build / REACH_FILE).write_bytes(write_json(reach))
    shutil.rmtree(build / KEPT_DIR)
    with pytest.raises(UserError, match="which the generator's output does not prove unreachable"):
        proven_reach(build, tree)

    # an install prefix's record (`bundle build --images PREFIX`), proven against a build folder of the same tree
    again = tmp_path / "again"
    _generate(tree, spec, again / "v3src")
    prune(again / "v3src", tree)
    prefix = tmp_path / "prefix"
    record_in_prefix(prefix, reach)
    assert confirm_left_out(read_prefix_reach(prefix), again, tree) == []
    record_in_prefix(prefix, reach.model_copy(update={"packages_left_out": [*reach.packages_left_out, planted]}))
    problems = confirm_left_out(read_prefix_reach(prefix), again, tree)
    assert len(problems) == 1 and problems[0].startswith(image), problems


def test_a_hostile_record_is_refused(tmp_path):
    record = tmp_path / REACH_FILE
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"mode": "dispatched", "packages_left_out": [
        {"image": "../../../etc/passwd", "member": None, "kernels": 1}]}))
    with pytest.raises(UserError, match="not a path inside aotriton.images"):
        read_reach(tmp_path)
    record.write_text("[1, 2]")
    with pytest.raises(UserError, match="not a reach record"):
        read_reach(tmp_path)


def test_plan_and_precompile_can_take_the_builds_kernels(fresh_tree):
    """`precompile --kernels dispatched` plans what `build --kernels dispatched` compiles: the
    generator's list less the fused kernels of the left-out packages, nothing else."""
    from codegen.plan.run import PlanOptions, run_plan

    tree, spec = _applied(fresh_tree, "0.11b")
    every = run_plan(PlanOptions(tree, python=sys.executable)).entries
    kept = run_plan(PlanOptions(tree, python=sys.executable, kernels="dispatched")).entries
    gone = {e.id for e in every} - {e.id for e in kept}
    assert len(gone) == 171 and {e.id for e in kept} <= {e.id for e in every}
    assert all(i.startswith(FUSED_FAMILY + "-") for i in gone)
    assert sum(e.config.family == FUSED_FAMILY for e in kept) == 171
