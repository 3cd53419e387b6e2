"""codegen.imagebuild.reach and the generator hook, without a tree: which runs the hook acts on, the
--kernels choice, removing left-out images from a prefix (inside it only), the record's format.
On real trees: tests/test_build_reach.py."""

from __future__ import annotations

import json
import os
import sys

import pytest

from codegen.imagebuild import builder
from codegen.compile import client as compile_client
from codegen.imagebuild.builder import BuildOptions
from codegen.imagebuild.configure import REACH_MODULE
from codegen.imagebuild.reach import REACH_FILE, is_current, read_reach, remove_from_prefix
from codegen.models.reach import REACH_FORMAT, LeftOut, Reach
from codegen.plan.reach import check_mode
from codegen.core.contain import Escape
from codegen.core.errors import UserError


@pytest.mark.parametrize("argv, want", [
    (["py", "-X", "utf8", "-m", "v3python.generate", "--target_gpus", "gfx908_mod0", "--build_dir", "/b/v3src"],
     "/b/v3src"),
    (["py", "-X", "utf8", "-m", "aotriton.generate", "--build_dir", "/b/v3src", "--root_dir", "/t"], "/b/v3src"),
    (["py", "-m", "v3python.write_image_signature", "/b/v3src"], None),      # not the generator
    (["py", "-m", "aotriton.database_compose", "--build_dir", "/b"], None),
    (["py", "/t/v3python/compile.py", "x.py", "-o", "o.hsaco"], None),        # a kernel compile
    (["py", "-m", "v3python.generate"], None),                               # no build dir
    (["py", "-m", "v3python.generate", "--build_dir"], None),
])
def test_the_hook_acts_on_the_generator_only(monkeypatch, argv, want):
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert compile_client._generator_build_dir() == (None if want is None else os.path.abspath(want))


def test_the_hook_runs_once_per_generator_not_in_its_workers(monkeypatch):
    """The outermost generator run takes the knob out of the environment its workers inherit."""
    monkeypatch.setattr(sys, "orig_argv", ["py", "-m", "aotriton.generate", "--build_dir", "/b/v3src"])
    monkeypatch.setenv(compile_client.REACH_ENV, sys.executable)
    monkeypatch.delenv(compile_client.POOL_ENV, raising=False)
    seen = []
    monkeypatch.setattr(compile_client, "_reach_hook", lambda *a: seen.append(a))
    compile_client._hook()                       # installed without a module to run: nothing to do
    assert seen == [] and compile_client.REACH_ENV in os.environ
    compile_client._hook(REACH_MODULE)
    assert seen == [(sys.executable, REACH_MODULE)] and compile_client.REACH_ENV not in os.environ
    compile_client._hook(REACH_MODULE)           # a worker: the knob is gone
    assert seen == [(sys.executable, REACH_MODULE)]


def test_kernels_modes():
    check_mode("dispatched")
    check_mode("all")
    with pytest.raises(UserError, match="--kernels 'some': one of dispatched, all"):
        check_mode("some")


def test_tuning_builds_and_all_build_every_kernel(tmp_path):
    opts = BuildOptions(tmp_path, tmp_path / "p")
    assert builder._reach_python(opts) == sys.executable
    assert builder._reach_python(BuildOptions(tmp_path, tmp_path / "p", kernels="all")) is None
    assert builder._reach_python(BuildOptions(tmp_path, tmp_path / "p", for_tuning=True)) is None


def test_an_interpreter_path_cmake_cannot_carry_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", '/opt/my "py"/bin/python')
    with pytest.raises(UserError, match="a path CMake's environment cannot carry") as exc:
        builder._reach_python(BuildOptions(tmp_path, tmp_path / "p"))
    assert "--kernels all" in exc.value.hint


def _record(build, **kw):
    path = build / REACH_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(Reach(**kw).to_json()))


def test_removing_left_out_images_from_a_prefix(tmp_path):
    images = tmp_path / "prefix" / "lib" / "aotriton.images" / "amd-gfx908" / "flash" / "bwd_kernel_fuse"
    images.mkdir(parents=True)
    (images / "A.aks2").write_bytes(b"x")
    (images / "B.aks2").write_bytes(b"y")
    reach = Reach(packages_left_out=[
        LeftOut(image="amd-gfx908/flash/bwd_kernel_fuse/A.aks2", member=None, kernels=3),
        LeftOut(image="amd-gfx908/flash/bwd_kernel_fuse.zip", member="Q=…", kernels=2)])
    assert remove_from_prefix(tmp_path / "prefix", reach) == 1
    assert not (images / "A.aks2").exists() and (images / "B.aks2").is_file()
    assert remove_from_prefix(tmp_path / "prefix", reach) == 0 and remove_from_prefix(tmp_path / "prefix", None) == 0


def test_a_link_on_the_way_out_of_the_prefix_is_refused(tmp_path):
    outside = tmp_path / "outside" / "flash"
    outside.mkdir(parents=True)
    (outside / "A.aks2").write_bytes(b"keep")
    root = tmp_path / "prefix" / "lib" / "aotriton.images"
    root.mkdir(parents=True)
    (root / "amd-gfx908").symlink_to(tmp_path / "outside")
    reach = Reach(packages_left_out=[LeftOut(image="amd-gfx908/flash/A.aks2", member=None, kernels=1)])
    with pytest.raises(Escape):
        remove_from_prefix(tmp_path / "prefix", reach)
    assert (outside / "A.aks2").read_bytes() == b"keep"


def test_a_record_of_another_format_configures_again(tmp_path):
    assert not is_current(tmp_path)                      # none
    _record(tmp_path, format=REACH_FORMAT - 1)
    assert not is_current(tmp_path)
    _record(tmp_path)
    assert is_current(tmp_path) and read_reach(tmp_path).format == REACH_FORMAT
    (tmp_path / REACH_FILE).write_text("{not json")
    assert not is_current(tmp_path)


def test_a_prefix_says_what_its_images_lack(tmp_path):
    """build records the left-out packages in the install prefix (`bundle build --images` proves
    each again from its own build folder's generator output: tests/test_build_reach.py)."""
    from codegen.imagebuild.reach import read_prefix_reach, record_in_prefix

    a = LeftOut(image="amd-gfx908/flash/bwd_kernel_fuse/A.aks2", member=None, kernels=2,
                functional={"Q": "fp16", "PADDED_HEAD": "True"})
    b = LeftOut(image="amd-gfx908/flash/bwd_kernel_fuse.zip", member="Q=…", kernels=1, functional={"Q": "fp8"})
    prefix = tmp_path / "prefix"
    record_in_prefix(prefix, Reach(kernels_left_out=3, packages_left_out=[a, b]))
    assert read_prefix_reach(prefix).packages_left_out == [a, b]
    record_in_prefix(prefix, Reach())      # a build that left nothing out: no record
    assert read_prefix_reach(prefix) is None


def test_disagreement_names_the_first_package_in_question():
    from codegen.imagebuild.reach import disagreement

    fused = LeftOut(image="amd-gfx908/flash/bwd_kernel_fuse/A.aks2", member=None, kernels=2, functional={"Q": "fp16"})
    fwd = LeftOut(image="amd-gfx908/flash/attn_fwd/B.aks2", member=None, kernels=1, functional={"Q": "bf16"})
    proof = Reach(kernels_left_out=2, fused_kernels=4, packages_left_out=[fused])
    assert disagreement(proof, proof) is None
    assert "lists amd-gfx908/flash/attn_fwd/B.aks2 as left out" in disagreement(
        Reach(kernels_left_out=3, fused_kernels=4, packages_left_out=[fused, fwd]), proof)
    assert "does not list amd-gfx908/flash/bwd_kernel_fuse/A.aks2" in disagreement(Reach(fused_kernels=4), proof)
    # the same package, another functional or count: not the one proven
    other = fused.model_copy(update={"kernels": 1})
    assert "lists amd-gfx908/flash/bwd_kernel_fuse/A.aks2" in disagreement(
        Reach(kernels_left_out=2, fused_kernels=4, packages_left_out=[other]), proof)
    assert "kernels_left_out" in disagreement(Reach(kernels_left_out=9, fused_kernels=4, packages_left_out=[fused]), proof)


def test_precompile_refuses_dispatched_for_tuning_lists_and_reports(tmp_path):
    from codegen.compile.precompile import PrecompileOptions

    for kw in ({"tuning": True}, {"tuning_report": tmp_path / "r.json"}):
        with pytest.raises(UserError, match="--kernels dispatched compiles a build's kernels"):
            PrecompileOptions(tmp_path, kernels="dispatched", no_cache=True, python=sys.executable, **kw).check()
    with pytest.raises(UserError, match="--kernels 'x'"):
        PrecompileOptions(tmp_path, kernels="x").check()


def test_a_fifo_or_a_folder_as_the_record_is_one_message_not_a_hang(tmp_path):
    path = tmp_path / REACH_FILE
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    with pytest.raises(UserError, match="FIFO"):
        read_reach(tmp_path)
    path.unlink()
    path.mkdir()
    with pytest.raises(UserError, match="directory"):
        read_reach(tmp_path)


def test_bundle_build_refuses_an_images_prefix_whose_record_is_not_proven(tmp_path, monkeypatch):
    """`bundle build --images PREFIX`: a prefix record that this build folder's generator output
    does not prove (codegen.imagebuild.reach.confirm_left_out, on real trees in
    tests/test_build_reach.py) is one message, exit 2, before any image is copied."""
    from types import SimpleNamespace

    from codegen.imagebuild import reach as reach_mod
    from codegen.imagebuild.verify import Verification
    from codegen.ship import bundle

    record = Reach(kernels_left_out=1, packages_left_out=[
        LeftOut(image="amd-gfx908/flash/attn_fwd/B.aks2", member=None, kernels=1)])
    monkeypatch.setattr(reach_mod, "read_prefix_reach", lambda prefix: record)
    seen = []
    monkeypatch.setattr(reach_mod, "confirm_left_out",
                        lambda r, build_dir, tree: seen.append((build_dir, tree)) or [f"{r.packages_left_out[0].image}: no"])
    copied = []
    monkeypatch.setattr(bundle, "_copy_images", lambda *a: copied.append(a))
    rep = SimpleNamespace(verification=Verification(library="lib"), arch="gfx908")
    with pytest.raises(UserError, match="amd-gfx908/flash/attn_fwd/B.aks2: no") as exc:
        bundle._built_kernels(tmp_path / "tree", 6, rep, None, tmp_path / "p", tmp_path / "b", tmp_path / "images")
    assert exc.value.exit_code == 2 and "mi100-codegen build" in exc.value.hint
    assert seen == [(tmp_path / "b", tmp_path / "tree")] and copied == []
