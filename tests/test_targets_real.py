"""The issue-14 targets (rules/mi50.yaml: gfx906 wave64 without AGPRs or matrix cores;
rules/rdna2.yaml: gfx1030 wave32) on the real release trees: `apply` (a second apply changes
nothing), `plan` (only the target's GPU, exactly its head dims) and `revert` (byte-identical),
one applied tree per release and spec. The plan runs upstream's generator (about 10 s): one
release in the default run, the others under `slow`."""

from __future__ import annotations

import json
import os
import sys
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.models import KernelConfig
from codegen.formats.spec import load_spec
from codegen.upstream import SUPPORTED_RELEASES
from fake_tree import snapshot

pytestmark = pytest.mark.aotriton
REPO = Path(__file__).resolve().parents[1]
SPECS = ("mi50", "rdna2")
PLAN_DEFAULT = "0.11b"  # the plan of the other releases runs under `slow`


def _cli(*args, env=None):
    return CliRunner().invoke(app, list(args), env=env)


def _cases():
    for name in SPECS:
        for tag in SUPPORTED_RELEASES:
            marks = () if tag == PLAN_DEFAULT else (pytest.mark.slow,)
            yield pytest.param(name, tag, True, marks=marks, id=f"{name}-{tag}-plan")
            if tag != PLAN_DEFAULT:
                yield pytest.param(name, tag, False, id=f"{name}-{tag}")


@pytest.mark.parametrize(("name", "tag", "with_plan"), list(_cases()))
def test_target_apply_plan_revert(pristine_tree, fresh_tree, name, tag, with_plan):
    spec_path = REPO / "rules" / f"{name}.yaml"
    spec = load_spec(spec_path).spec
    pristine, tree = pristine_tree(tag), fresh_tree(tag)
    res = _cli("apply", str(tree), "--spec", str(spec_path), "--json")
    assert res.exit_code == 0, res.output
    first = json.loads(res.stdout)
    assert first["release"] == tag and first["ok"]
    floors = spec.rows.min_num_warps.as_dict()  # rdna2: 8 for every family (the donor's 2/4-warp rows spill)
    if floors:
        raised = {t: st["warps_raised"] for tables in first["rows"].values() for t, st in tables.items()
                  if st.get("warps_raised")}
        assert raised and all(t.split("$")[-1] in floors for t in raised), raised
    # the arch lists hold the arch, whichever arch `like` names and wherever it sits
    cmake = (tree / "CMakeLists.txt").read_text(encoding="utf-8")
    arch_list = re.search(r'set\(AOTRITON_TARGET_ARCH "([^"]*)"', cmake).group(1).split(";")
    assert arch_list.count(spec.arch) == 1 and arch_list[1] == spec.arch
    compile_py = next(p for p in (tree / "v3python" / "compile.py", tree / "python" / "compile.py") if p.exists())
    known = re.search(rf"KNOWN_TARGETS_{spec.warp_size} = \[([^\]]*)\]", compile_py.read_text(encoding="utf-8"))
    assert known.group(1).split(",")[0].strip() == f"'{spec.arch}'"

    _check_split_backward(tree, tag, spec, first)

    applied = snapshot(tree)
    res = _cli("apply", str(tree), "--spec", str(spec_path), "--json")
    assert res.exit_code == 0, res.output
    second = json.loads(res.stdout)
    assert [(f["path"], f["verdict"]) for f in second["files"] if f["verdict"] != "identical"] == []
    assert not second["changed"] and snapshot(tree) == applied

    if with_plan:
        env = {k: v for k, v in os.environ.items() if k != "AOTRITON_FLASH_BLOCK_DMODEL"}
        res = _cli("plan", str(tree), "--spec", str(spec_path), "--json", "--python", sys.executable, env=env)
        assert res.exit_code == 0, res.output
        plan = json.loads(res.stdout)
        assert plan["gpu"] == spec.primary_gpu
        assert {k for k in plan["by_head_dim"] if k != "none"} == {str(h) for h in spec.head_dims}
        assert set(plan["by_dtype"]) == set(spec.dtypes)
        assert {name.split(".")[1] for name in plan["by_config"]} == {spec.arch}
        # the tree's own generator compiles only raised configs: the rows hold no fewer warps
        low = [n for n in plan["by_config"] if n.split(".")[0] in floors
               and KernelConfig.parse(n).num_warps < floors[n.split(".")[0]]]
        assert low == []
        assert plan["total"] > 0 and snapshot(tree) == applied

    res = _cli("revert", str(tree))
    assert res.exit_code == 0, res.output
    diff = subprocess.run(["diff", "-r", str(pristine), str(tree)], capture_output=True, text=True).stdout
    assert diff == ""


def _op_rows(tree: Path, rel: str, gpu: str) -> list[tuple[str, int, int]]:
    """(dtype, head dim, backend) of every op_attn_bwd row of GPU in the tree's op database."""
    import sqlite3

    from codegen.formats.tuning_db import read_archive
    from codegen.formats import tuning_db as db

    _, payload = read_archive((tree / rel).read_bytes(), rel)
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(payload)
        return conn.execute(f'SELECT "{db.DTYPE}", "{db.HEAD_DIM}", "{db.OP_BACKEND}" FROM "{db.OP_ATTN_BWD_TABLE}" '
                            "WHERE gpu = ?", (gpu,)).fetchall()
    finally:
        conn.close()


def _check_split_backward(tree: Path, tag: str, spec, applied: dict) -> None:
    """rows.split_backward: no op_attn_bwd row of the target picks the fused kernel for a routed pass;
    the other passes keep the donor's choices (fused ones included)."""
    from codegen.models.dtypes import by_torch
    from codegen.models.rows import splits_backward
    from codegen.upstream import by_release
    from codegen.formats import tuning_db as db

    rules = spec.rows.split_backward
    adapter = by_release(tag)
    if not rules or adapter.op_db is None:
        return
    rows = _op_rows(tree, adapter.op_db, spec.primary_gpu)
    stats = applied["rows"][adapter.op_db][db.OP_ATTN_BWD_TABLE]
    donor = _op_rows(tree, adapter.op_db, spec.rows.donor_gpu)
    if not donor:   # the donor has no op rows in this release (gfx1100 before 0.12b): none seeded, none routed
        assert rows == [] and stats.get("split_routed", 0) == 0, stats
        return
    routed = [r for r in rows if splits_backward(rules, by_torch(r[0]).short, r[1])]
    assert routed, f"no {spec.primary_gpu} op row for the passes rows.split_backward routes"
    assert all(b != db.BWD_BACKEND_FUSED for _, _, b in routed), "a routed pass still picks the fused kernel"
    donor_fused = sum(1 for d, h, b in donor if b == db.BWD_BACKEND_FUSED
                      and splits_backward(rules, by_torch(d).short, h) and h in spec.head_dims)
    assert donor_fused and stats.get("split_routed", 0) == donor_fused * len(spec.gpus), (donor_fused, stats)
    kept = {b for d, h, b in rows if not splits_backward(rules, by_torch(d).short, h)}
    donor_kept = {b for d, h, b in donor if not splits_backward(rules, by_torch(d).short, h) and h in spec.head_dims}
    assert kept == donor_kept, (kept, donor_kept)


@pytest.mark.parametrize("tag", [t for t in SUPPORTED_RELEASES if t != "0.10b"])
def test_op_backend_numbers_are_the_releases_own(pristine_tree, tag):
    """op$backend 0 is the split backend and 1 the fused kernel in every release with an op database
    (codegen.formats.tuning_db): read from the release's own operator definition."""
    from codegen.formats import tuning_db as db

    tree = pristine_tree(tag)
    old = tree / "v3python" / "rules" / "flash" / "__init__.py"
    if old.is_file():  # 0.11b..0.12.1b: the order of OpAttnBwd([...])
        text = old.read_text(encoding="utf-8")
        body = text[text.index("OpAttnBwd(["):]
        names = [m.group(1) or m.group(2) for m in re.finditer(r"^        (?:MetroBwdKernel\('(\w+)'|__(\w+),)",
                                                                  body, re.M)]
        assert names[db.BWD_BACKEND_SPLIT] == "triton_split" and names[db.BWD_BACKEND_FUSED] == "bwd_kernel_fuse", names
    else:  # 0.13b: @ati.backend(n, kernel, 'name') above op_attn_bwd
        text = (tree / "modules" / "flash" / "aot" / "__init__.py").read_text(encoding="utf-8")
        block = text[:text.index("def op_attn_bwd")].rsplit("@ati.start", 1)[1]
        found = {int(n): name for n, name in re.findall(r"@ati\.backend\((\d+), \w+, '(\w+)'\)", block)}
        assert found[db.BWD_BACKEND_SPLIT] == "triton_split" and found[db.BWD_BACKEND_FUSED] == "bwd_kernel_fuse"
