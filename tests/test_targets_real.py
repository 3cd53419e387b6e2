"""The issue-14 targets (rules/mi50.yaml: gfx906 wave64 without AGPRs or matrix cores;
rules/rdna2.yaml: gfx1030 wave32) on the real release trees: `apply` (a second apply changes
nothing), `plan` (only the target's GPU, exactly its head dims) and `revert` (byte-identical),
one applied tree per release and spec. The plan runs upstream's generator (about 10 s): one
release in the default run, the others under `slow`."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.models import KernelConfig
from codegen.spec import load_spec
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

    applied = snapshot(tree)
    res = _cli("apply", str(tree), "--spec", str(spec_path), "--json")
    assert res.exit_code == 0, res.output
    second = json.loads(res.stdout)
    assert [(f["path"], f["verdict"]) for f in second["files"] if f["verdict"] != "identical"] == []
    assert not second["changed"] and snapshot(tree) == applied

    if with_plan:
        env = {k: v for k, v in os.environ.items() if k != "AOTRITON_FLASH_BLOCK_DMODEL"}
        res = _cli("plan", str(tree), "--spec", str(spec_path), "--json", env=env)
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
