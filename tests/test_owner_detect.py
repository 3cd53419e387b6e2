"""Detection for the owner's command (issue 31 item 1): the card from a fake machine's KFD topology
(one sysfs root per card family, one with two archs), the family whose spec serves it (the shipped
specs' own `arch`), the HSA override of gfx1031–gfx1036 said and checked, an unreadable topology
(one message naming --arch), and the torch facts of wheel-shaped ROCm torch folders (tests/owner_machine.py); `torch status` shows them, text and JSON."""

from __future__ import annotations

import json
import os

import pytest

from codegen.core.errors import UserError
from codegen.formats.spec import load_spec
from codegen.models.archs import LLVM_AMDGPU_TARGETS, RUNS_AS, arch_of_target_version, hsa_version
from codegen.ship.detect import (DetectOptions, KfdUnreadable, detect_machine, families, family_of, kfd_gpus,
                                 match_card, parse_probe, torch_facts, wheel_lines)
from codegen.ship.layout import inspect_torch
from owner_machine import TARGET_VERSION, sysfs, wheel
from test_torch_install import cli, snapshot


def test_target_versions_spell_every_llvm_processor():
    """KFD's number and HSA_OVERRIDE_GFX_VERSION's spelling are two views of one name."""
    assert arch_of_target_version(90008) == "gfx908" and arch_of_target_version(90010) == "gfx90a"
    assert arch_of_target_version(100300) == "gfx1030" and arch_of_target_version(0) is None
    assert arch_of_target_version(90016) is None and arch_of_target_version(10**7) is None
    assert hsa_version("gfx1030") == "10.3.0" and hsa_version("gfx90a") == "9.0.10"
    for arch in LLVM_AMDGPU_TARGETS:
        major, minor, step = map(int, hsa_version(arch).split("."))
        assert arch_of_target_version(major * 10000 + minor * 100 + step) == arch


def test_families_are_the_shipped_specs():
    """The arch -> spec table is the specs' own `arch`: one family per rules/*.yaml."""
    got = {f.arch: f.spec for f in families()}
    assert got == {"gfx908": "mi100", "gfx906": "mi50", "gfx1030": "rdna2"}
    for f in families():
        assert load_spec(f.path).spec.arch == f.arch
    assert family_of("gfx1032").arch == "gfx1030" and family_of("gfx90a") is None
    assert all(family_of(a).spec == "rdna2" for a in RUNS_AS)


@pytest.mark.parametrize("arch,spec", [("gfx908", "mi100"), ("gfx906", "mi50"), ("gfx1030", "rdna2")])
def test_each_family_machine_is_matched(tmp_path, arch, spec):
    root = sysfs(tmp_path / "sys", arch, arch)
    gpus = kfd_gpus(root)
    assert [(g.arch, g.devices) for g in gpus] == [(arch, 2)]
    card = match_card(gpus, env={})
    assert card.family.spec == spec and card.problem is None and card.override is None


def test_rdna2_variants_need_the_override_and_it_is_checked(tmp_path):
    gpus = kfd_gpus(sysfs(tmp_path / "sys", "gfx1031"))
    unset = match_card(gpus, env={})
    assert unset.family.arch == "gfx1030" and unset.override == "10.3.0" and not unset.override_ok
    assert match_card(gpus, env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}).override_ok
    assert not match_card(gpus, env={"HSA_OVERRIDE_GFX_VERSION": "9.0.8"}).override_ok
    # gfx1030 beside gfx1031: one bundle serves both, the override decides
    both = match_card(kfd_gpus(sysfs(tmp_path / "both", "gfx1030", "gfx1031")), env={})
    assert both.problem is None and both.arch == "gfx1031" and both.override == "10.3.0"


def test_an_unsupported_card_names_the_families(tmp_path):
    card = match_card(kfd_gpus(sysfs(tmp_path / "sys", "gfx90a")), env={})
    assert card.family is None
    assert "gfx90a: not a card mi100-codegen builds for (AMD's AOTriton ships kernels for it (0.10b" in card.problem
    for arch in ("gfx908", "gfx906", "gfx1030", "gfx1031–gfx1036 with HSA_OVERRIDE_GFX_VERSION=10.3.0"):
        assert arch in card.problem


def test_two_archs_are_said_and_picked_by_arch(tmp_path):
    gpus = kfd_gpus(sysfs(tmp_path / "sys", "gfx908", "gfx1030", "gfx908"))
    card = match_card(gpus, env={})
    assert card.family is None and "gfx1030 (1 device), gfx908 (2 devices)" in card.problem
    assert "--arch" in card.problem
    assert match_card(gpus, "gfx1030", env={}).family.spec == "rdna2"
    with pytest.raises(UserError, match="--arch: 'gfx9999' is not an AMDGPU processor"):
        match_card(gpus, "gfx9999", env={})


def test_kfd_topology_read_as_hostile_input(tmp_path):
    assert kfd_gpus(tmp_path / "none") is None                      # no amdgpu driver
    root = sysfs(tmp_path / "sys")                                   # a CPU node only
    assert kfd_gpus(root) == []
    nodes = root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    (nodes / "7").mkdir()
    (nodes / "7" / "properties").write_text("gfx_target_version 9x0008\n")   # not a number: no GPU
    (nodes / "8").mkdir()
    os.mkfifo(nodes / "8" / "properties")                             # never waited on
    (nodes / "9").mkdir()
    (nodes / "9" / "properties").write_bytes(b"gfx_target_version 90006\n" + b"x" * (70 << 10))   # too large
    (nodes / "10").mkdir()
    (nodes / "10" / "properties").write_text(f"gfx_target_version {TARGET_VERSION['gfx908']}\n")
    (nodes / "not-a-node").mkdir()
    (nodes / "\u00b2").mkdir()                                        # str.isdigit says yes, int says no
    (nodes / "11").mkdir()
    (nodes / "11" / "properties").write_text("gfx_target_version \u00b9\n")
    (nodes / "12").mkdir()
    (nodes / "12" / "properties").write_text("gfx_target_version " + "9" * 5000 + "\n")   # past int()'s digits
    assert [(g.arch, g.devices) for g in kfd_gpus(root)] == [("gfx908", 1)]


def _unreadable(monkeypatch, root):
    """`root`'s KFD nodes unreadable (as for an unprivileged user: the tests run as root, whom a
    mode does not stop, so the listing itself fails)."""
    nodes = root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    real = os.listdir

    def listdir(path="."):
        if os.fspath(path) == os.fspath(nodes):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    return nodes


def test_an_unreadable_kfd_topology_is_one_message_naming_arch(tmp_path, monkeypatch):
    """torch status and --bundle auto --dry-run: exit 3, what could not be read, how to name the
    card; with --arch the card is named and the topology's failure is a note."""
    root = wheel(tmp_path / "site", "2.9-rocm6.4")
    nodes = _unreadable(monkeypatch, sysfs(tmp_path / "sys", "gfx908"))
    with pytest.raises(KfdUnreadable):
        kfd_gpus(tmp_path / "sys")
    for args in (["torch", "status"], ["torch", "install", "--bundle", "auto", "--index", str(tmp_path), "--dry-run"]):
        r = cli(*args, "--torch-dir", str(root), "--sysfs", str(tmp_path / "sys"))
        assert r.exit_code == 3, r.output
        assert f"cannot read the KFD topology at {nodes} ({nodes}: Permission denied (EACCES))" in r.output
        assert "--arch ARCH (gfx1030 for rdna2, gfx906 for mi50, gfx908 for mi100)" in r.output
        assert "Traceback" not in r.output
    r = cli("torch", "status", "--torch-dir", str(root), "--sysfs", str(tmp_path / "sys"), "--arch", "gfx908")
    assert r.exit_code == 0 and "card:             gfx908 -> bundle arch gfx908, spec mi100" in r.stdout, r.output
    assert "cannot read the KFD topology" in r.stdout


def test_torch_probe_answer_is_parsed_strictly():
    gpus, why = parse_probe(['["gfx908:sramecc+:xnack-", "gfx908:sramecc+:xnack-"]'])
    assert why is None and [(g.arch, g.devices, g.target) for g in gpus] == [("gfx908", 2, "gfx908:sramecc+:xnack-")]
    for bad in ([], ["not json"], ['{"a": 1}'], ['["gfx908\\n"]'], ['["../x"]']):
        assert parse_probe(bad)[0] == [] and parse_probe(bad)[1]


def test_torch_facts_of_each_wheel(tmp_path):
    t29 = torch_facts(inspect_torch(wheel(tmp_path / "a", "2.9-rocm6.4")))
    assert (t29.aotriton, t29.release_tag, t29.release_line, t29.build_release, t29.hip_major) == \
        ("shared", "0.11b", "0.11", "0.11.2b", 6)
    assert t29.problem is None and "libamdhip64.so.6" in t29.hip_source
    t214 = torch_facts(inspect_torch(wheel(tmp_path / "b", "2.14-rocm7")))
    assert (t214.release_tag, t214.build_release, t214.hip_major, t214.problem) == ("0.13b", "0.13b", 7, None)
    off = torch_facts(inspect_torch(wheel(tmp_path / "c", "flash-off")), "gfx1030")
    assert off.aotriton == "none" and off.hip_major == 7
    assert "does not link AOTriton at all" in off.problem and "TheRock" in off.problem
    assert "torch rebuild-recipe --release 0.11b --arch gfx1030" in off.problem
    for line in wheel_lines():
        assert line in off.problem
    assert "download.pytorch.org/whl/rocm6.4" in off.problem


def test_status_shows_the_card_and_the_torch(tmp_path):
    root = wheel(tmp_path / "site", "2.9-rocm6.4")
    sys_root = sysfs(tmp_path / "sys", "gfx1031")
    r = cli("torch", "status", "--torch-dir", str(root), "--sysfs", str(sys_root))
    assert r.exit_code == 0, r.output
    assert "GPUs:             gfx1031 (1 device)" in r.stdout
    assert "card:             gfx1031 -> bundle arch gfx1030, spec rdna2: rules/rdna2.yaml" in r.stdout
    assert "HSA_OVERRIDE_GFX_VERSION=10.3.0: NOT set in this environment" in r.stdout
    assert "HIP major:        6  (libamdhip64.so.6" in r.stdout
    s = json.loads(cli("torch", "status", "--torch-dir", str(root), "--sysfs", str(sys_root), "--json").stdout)
    m = s["machine"]
    assert m["card"]["family"]["spec"] == "rdna2" and m["card"]["override"] == "10.3.0"
    assert m["torch"]["build_release"] == "0.11.2b" and m["torch"]["hip_major"] == 6
    r = cli("torch", "status", "--torch-dir", str(root), "--sysfs", str(sysfs(tmp_path / "two", "gfx908", "gfx906")),
            "--arch", "gfx906")
    assert "card:             gfx906 -> bundle arch gfx906, spec mi50" in r.stdout, r.output


def test_status_of_a_flash_off_torch_says_what_fits(tmp_path):
    root = wheel(tmp_path / "site", "flash-off")
    before = snapshot(tmp_path / "site")
    r = cli("torch", "status", "--torch-dir", str(root), "--sysfs", str(sysfs(tmp_path / "sys", "gfx1030")))
    assert r.exit_code == 0, r.output
    assert "no bundle fits:   torch 2.9.1+rocm7.10.0 does not link AOTriton at all" in r.stdout
    assert snapshot(tmp_path / "site") == before


def test_status_says_what_is_missing_and_the_one_next_step(tmp_path, monkeypatch):
    """Issue 39 item 3: every gap on the way to a drop-in is listed (`missing`), and `next` is the
    step of the first one, else the next stage; a command in it carries the user's own options and
    runs as printed (tests/test_hints.py's parser)."""
    from test_hints import check, command_lines

    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    good, off = wheel(tmp_path / "a", "2.9-rocm6.4"), wheel(tmp_path / "b", "flash-off")
    rdna2, nothing = sysfs(tmp_path / "s1", "gfx1031"), sysfs(tmp_path / "s2")

    def status(root, machine, *args):
        r = cli("torch", "status", "--torch-dir", str(root), "--sysfs", str(machine), "--json", *args)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    s = status(off, nothing)
    assert s["missing"][0].startswith("a torch a bundle can go into") and s["missing"][1].startswith("a GPU")
    assert s["next"].startswith("install a pytorch.org ROCm wheel: ") and wheel_lines()[-1] in s["next"]
    s = status(good, nothing)
    assert len(s["missing"]) == 1 and "lists no GPU" in s["missing"][0]
    assert "mi100-codegen torch status --arch ARCH (gfx1030, gfx906, gfx908)" in s["next"]
    s = status(good, rdna2)
    assert s["missing"] == ["HSA_OVERRIDE_GFX_VERSION=10.3.0 in this environment"]
    assert s["next"] == "export HSA_OVERRIDE_GFX_VERSION=10.3.0 in every shell that runs torch"
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "10.3.0")
    s = status(good, rdna2, "--backup-dir", str(tmp_path / "bk"))
    assert s["missing"] == [] and s["hsa_override"] == "10.3.0"
    assert s["next"] == f"mi100-codegen torch install --bundle auto --torch-dir {good} --backup-dir {tmp_path / 'bk'}"
    text = cli("torch", "status", "--torch-dir", str(good), "--sysfs", str(rdna2)).stdout
    assert f"next:             mi100-codegen torch install --bundle auto --torch-dir {good}" in text
    for step in (s["next"], status(good, nothing)["next"]):
        (argv,) = command_lines(step)
        assert check(argv) is None, step


def test_detect_machine_asks_torch_only_without_kfd(tmp_path):
    asked = []

    def probe():
        asked.append(1)
        return parse_probe(['["gfx906:sramecc+:xnack-"]'])

    m = detect_machine(None, DetectOptions(sysfs=tmp_path / "no-kfd"), env={}, probe=probe)
    assert asked and m.card.family.spec == "mi50" and m.gpus[0].target == "gfx906:sramecc+:xnack-"
    m = detect_machine(None, DetectOptions(sysfs=sysfs(tmp_path / "sys", "gfx908")), env={}, probe=probe)
    assert len(asked) == 1 and m.card.family.spec == "mi100"


def test_torch_is_asked_in_a_child_process():
    """The torch this Python imports, asked for real (a CPU or CUDA build here): no AMD GPU, no note."""
    import importlib.util

    from codegen.ship.detect import torch_gpus

    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch")
    assert torch_gpus() == ([], None)
