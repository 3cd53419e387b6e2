"""Issue 20, items 5-8: every output is checked before any work, every input may be a FIFO, a
device, a directory or a link loop, every external probe has a time limit, and every bad input
is one message with exit 2 (3 for the machine: a full disk, no memory), never a traceback.

One real CLI run per class (Typer's CliRunner, or a subprocess where the condition belongs to
the process: stdout on /dev/full, a deleted working directory). We run as root here, so
permission bits do not stop us: read-only places are made with `chattr +i` (skipped where the
file system has no immutable flag) or `/proc/sys` (read-only for root too)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.cli import app

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "rules" / "mi100.yaml"


def invoke(args, **kw):
    r = CliRunner().invoke(app, [str(a) for a in args], **kw)
    assert "Traceback" not in r.output, r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


@pytest.fixture
def immutable(tmp_path):
    """A folder nobody, root included, may write into (chattr +i); removed flag on teardown."""
    d = tmp_path / "frozen"
    d.mkdir()
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode:
        pytest.skip("no immutable flag on this file system (chattr +i)")
    yield d
    subprocess.run(["chattr", "-i", str(d)], capture_output=True)


# ------------------------------------------------------------------ item 5: outputs first --

def _no_work(tree: Path) -> None:
    assert not (tree / "build").exists(), "build started work before refusing its outputs"


@pytest.mark.parametrize("case", ["prefix_file", "prefix_empty", "build_dir_file", "prefix_link_loop"])
def test_build_refuses_bad_outputs_before_any_work(tmp_path, case):
    tree = tmp_path / "tree"
    tree.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    args = {"prefix_file": ["--prefix", afile], "prefix_empty": ["--prefix", ""],
            "build_dir_file": ["--prefix", tmp_path / "p", "--build-dir", afile],
            "prefix_link_loop": ["--prefix", loop]}[case]
    r = invoke(["build", tree, *args, "--python", sys.executable])
    assert r.exit_code == 2, r.output
    assert {"prefix_file": "--prefix", "prefix_empty": "'--prefix': an empty path",
            "build_dir_file": "--build-dir", "prefix_link_loop": "link loop"}[case] in r.output
    _no_work(tree)
    assert not (tmp_path / "p").exists()


def test_build_refuses_an_unwritable_prefix(tmp_path, immutable):
    tree = tmp_path / "tree"
    tree.mkdir()
    r = invoke(["build", tree, "--prefix", immutable / "install", "--python", sys.executable])
    assert r.exit_code == 2 and "not writable" in r.output, r.output
    _no_work(tree)


def test_build_refuses_a_read_only_file_system():
    """/proc/sys is mounted read-only: not writable even for root (os.access says EROFS)."""
    if os.access("/proc/sys", os.W_OK):
        pytest.skip("/proc/sys is writable here")
    r = invoke(["build", REPO, "--prefix", "/proc/sys/mi100-install", "--python", sys.executable])
    assert r.exit_code == 2 and "--prefix" in r.output and "not writable" in r.output, r.output


@pytest.mark.parametrize("var", ["HOME", "XDG_CACHE_HOME", "MI100_CODEGEN_CACHE"])
def test_cache_folder_on_a_file_is_refused_naming_its_variable(tmp_path, monkeypatch, var):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for v in ("XDG_CACHE_HOME", "MI100_CODEGEN_CACHE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, str(afile))
    tree = tmp_path / "tree"
    tree.mkdir()
    r = invoke(["build", tree, "--prefix", tmp_path / "p"])
    assert r.exit_code == 2, r.output
    assert f"(the folder comes from ${var})" in r.output and "not a directory" in r.output, r.output
    _no_work(tree)
    r = invoke(["precompile", tree, "--python", sys.executable])  # its compile cache
    assert r.exit_code == 2 and f"${var}" in r.output, r.output


def test_cache_folder_in_a_read_only_place(tmp_path, monkeypatch, immutable):
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(immutable / "cache"))
    r = invoke(["precompile", tmp_path, "--python", sys.executable])
    assert r.exit_code == 2 and "not writable" in r.output and "MI100_CODEGEN_CACHE" in r.output, r.output


@pytest.mark.parametrize("content", [b"[]\n", b"{broken", b'{"arch": "gfx908"}', b"\xff\xfe",
                                     b'{"arch":"gfx908","gpu":"g","release":"0.11b","triton":"3.2",'
                                     b'"configs":{"attn_fwd.gfx908.fp16.d64.M64N32.wpe1.w4.s1.plv0":[]}}'])
def test_precompile_refuses_a_broken_tuning_report_before_compiling(tmp_path, content):
    """The report is merged into after the compile: a broken one is refused at the start."""
    report = tmp_path / "compile_report.json"
    report.write_bytes(content)
    r = invoke(["precompile", tmp_path / "no-tree", "--tuning-report", report, "--python", sys.executable])
    assert r.exit_code == 2, r.output
    assert f"{report}" in r.output and "AOTriton" not in r.output, r.output  # refused before the tree
    assert report.read_bytes() == content


@pytest.mark.parametrize("kind", ["dir", "fifo", "link_loop"])
def test_precompile_refuses_a_tuning_report_of_the_wrong_type(tmp_path, kind):
    report = tmp_path / "compile_report.json"
    {"dir": lambda: report.mkdir(), "fifo": lambda: os.mkfifo(report),
     "link_loop": lambda: report.symlink_to(report)}[kind]()
    r = invoke(["precompile", tmp_path / "no-tree", "--tuning-report", report, "--python", sys.executable])
    assert r.exit_code == 2 and "--tuning-report" in r.output, r.output


@pytest.mark.parametrize("args", [
    ["precompile", "T", "--timeout", "nan"],
    ["precompile", "T", "--timeout", "inf"],
    ["tune", "run", "T", "--budget-min", "nan"],
    ["tune", "import", "F", "--date", "garbage"],
    ["tune", "import", "F", "--date", "2026-02-30"],
    ["precompile", "T", "--json", ""],
    ["render", "--out", ""],
    ["validate", "--md", ""],
])
def test_option_values_that_mean_nothing_are_usage_errors(args):
    r = invoke(args)
    assert r.exit_code == 2 and "Invalid value" in r.output, r.output


def test_render_refuses_an_output_that_is_a_file(tmp_path):
    out = tmp_path / "ov"
    out.write_text("mine")
    r = invoke(["render", "--out", out])
    assert r.exit_code == 2 and out.read_text() == "mine", r.output


# ------------------------------------------------- item 6: inputs that are not plain files --

@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["spec", "check"], ["render", "--out", "OUT", "--spec"]])
@pytest.mark.parametrize("kind", ["fifo", "link_loop", "dir", "device"])
def test_spec_that_is_not_a_regular_file(tmp_path, command, kind):
    spec = tmp_path / "spec.yaml"
    {"fifo": lambda: os.mkfifo(spec), "link_loop": lambda: spec.symlink_to(spec),
     "dir": lambda: spec.mkdir(), "device": lambda: spec.symlink_to("/dev/zero")}[kind]()
    args = [str(tmp_path / "ov") if a == "OUT" else a for a in command]
    r = invoke([*args, spec])
    assert r.exit_code == 2, r.output
    assert {"fifo": "FIFO", "link_loop": "symbolic-link loop", "dir": "directory", "device": "device"}[kind] in r.output
    assert not (tmp_path / "ov").exists()


@pytest.mark.timeout(60)
def test_apply_with_a_fifo_spec_does_not_hang(tmp_path):
    spec = tmp_path / "spec.yaml"
    os.mkfifo(spec)
    r = invoke(["apply", tmp_path, "--spec", spec])
    assert r.exit_code == 2 and "FIFO" in r.output, r.output


@pytest.mark.timeout(120)
def test_python_that_never_answers_the_probe_is_killed(tmp_path, monkeypatch):
    """A `--python` that never exits (a shell script whose child holds the output pipe): the
    probe gives up after its limit and kills the whole process group."""
    from codegen.core.errors import EnvironmentMissing
    from codegen.toolchain import interpreter

    pidfile = tmp_path / "child.pid"
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pidfile}\nwait\n")
    script.chmod(0o755)
    monkeypatch.setattr(interpreter, "PROBE_TIMEOUT_S", 2.0)
    t0 = time.monotonic()
    with pytest.raises(EnvironmentMissing, match="did not answer a version probe within 2 s"):
        interpreter.probe(str(script))
    assert time.monotonic() - t0 < 30
    pid = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the probe's grandchild {pid} survived")


# -------------------------------------------------------------- item 7: no tracebacks --

def _run_cli(args, **kw):
    return subprocess.run([sys.executable, "-c", "from codegen.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("args", [["spec", "schema"], ["--version"], ["spec", "check"]])
def test_a_full_disk_under_stdout_is_one_message_exit_3(args):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-c", "from codegen.cli import main; main()", *args],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO)
    if args == ["spec", "check"]:  # its few bytes go out at the final flush
        assert p.returncode in (0, 3), p.stderr
    else:
        assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    if p.returncode == 3:
        assert "No space left on device" in p.stderr


def test_a_deleted_working_directory_is_one_message(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    code = ("import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); sys.argv = ['mi100-codegen', 'spec', "
            "'check']; from codegen.cli import main; main()")
    p = subprocess.run([sys.executable, "-c", code, str(gone)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 2, p.stderr
    assert "working directory no longer exists" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_memory_error_is_one_message_exit_3(tmp_path, monkeypatch):
    import codegen.render.inputs as inputs

    def boom(*_a, **_k):
        raise MemoryError

    monkeypatch.setattr(inputs, "render_overlay", boom)  # the guard wraps every command body alike
    r = invoke(["render", "--out", tmp_path / "ov"])
    assert r.exit_code == 3 and "out of memory" in r.output, r.output
    assert not (tmp_path / "ov").exists()


# -------------------------------------------------- item 8: refused, not accepted --

def test_prune_to_that_adds_nothing_leaves_the_spec_byte_identical(tmp_path):
    from codegen.compile.prune import prune_spec
    from codegen.formats.spec import load_spec

    spec = tmp_path / "mine.yaml"
    spec.write_bytes(b"# my own note, kept\n" + SPEC.read_bytes().replace(b"\nhead_dims:", b"\n# my own note\nhead_dims:", 1))
    before = spec.read_bytes()
    loaded = load_spec(spec)
    assert prune_spec(loaded, {}, spec) == 0
    assert spec.read_bytes() == before
    copy = tmp_path / "copy.yaml"
    assert prune_spec(loaded, {}, copy) == 0
    assert copy.read_bytes() == before


def test_prune_to_with_only_rules_already_there_leaves_it_byte_identical(tmp_path):
    from codegen.compile.prune import prune_spec
    from codegen.formats.spec import load_spec

    spec = tmp_path / "mine.yaml"
    spec.write_bytes(b"# mine\n" + SPEC.read_bytes())
    loaded = load_spec(spec)
    excl = loaded.spec.tuning.attn_fwd.exclude
    if not excl:
        pytest.skip("the default spec has no attn_fwd exclude rule to repeat")
    rule = {k: v for k, v in excl[0].model_dump().items() if v is not None}
    before = spec.read_bytes()
    assert prune_spec(loaded, {"attn_fwd": [rule]}, spec) == 0
    assert spec.read_bytes() == before




def _winners_with(tmp_path, **cells) -> Path:
    from codegen.formats.tuning_csv import WINNER_CSV_COLUMNS, read_csv

    src = REPO / "tuning" / "gfx908" / "winners.csv"
    rows = read_csv(src)
    row = {**rows[0], **cells}
    folder = tmp_path / "gfx908"
    folder.mkdir()
    out = folder / "winners.csv"
    import csv

    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(WINNER_CSV_COLUMNS), lineterminator="\n")
        w.writeheader()
        w.writerow(row)
    return out


@pytest.mark.parametrize("tile,why", [((7, 3), "BLOCK_M=7 is not a power of two"),
                                      ((512, 64), "BLOCK_M=512 is outside 16..256"),
                                      ((32, 64), "BLOCK_M=32 < BLOCK_N=64")])
def test_winner_with_a_tile_the_kernels_do_not_take_is_refused(tmp_path, tile, why):
    from codegen.core.errors import DataFileError
    from codegen.formats.tuning_csv import read_csv

    path = _winners_with(tmp_path, block_m=tile[0], block_n=tile[1])
    with pytest.raises(DataFileError) as exc:
        read_csv(path)
    assert exc.value.exit_code == 2
    assert any(ln.endswith(why) or why in ln for ln in exc.value.lines), exc.value.lines
    assert all(":2: block_n: tile" in ln for ln in exc.value.lines), exc.value.lines


def _record(**over) -> dict:
    rec = {"arch": "gfx908", "kernel_name": "attn_fwd", "result": "tuned",
           "inputs": {"Q_dtype": "float16", "D_HEAD": 64, "Max_seqlen_q": 1024, "Max_seqlen_k": 1024,
                      "CAUSAL_TYPE": True},
           "tuned_kernel": {"BLOCK_M": 64, "BLOCK_N": 32, "PRE_LOAD_V": False},
           "compiler_options": {"waves_per_eu": 1, "num_warps": 4, "num_stages": 1},
           "ut_passed": True, "time": [0.5, 0.4, 0.6], "adiffs": 0.001}
    for k, v in over.items():
        rec[k] = v
    return rec


TUNING_LOGS = {
    "binary": (b"\x00\xff\xfe\x01" * 64, "not UTF-8 text"),
    "number_overflow": (json.dumps(_record()).replace('"BLOCK_M": 64', '"BLOCK_M": 1e400').encode(),
                        "tuned_kernel.BLOCK_M: expected an integer"),
    "too_many_digits": (json.dumps(_record()).replace('"BLOCK_M": 64', '"BLOCK_M": ' + "9" * 5000).encode(),
                        "not a JSON line"),
    "nesting_100000_deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "list_for_mapping": (json.dumps(_record(compiler_options=[1, 2])).encode(),
                         "compiler_options: expected a mapping (JSON object), found a list"),
    "list_for_inputs": (json.dumps(_record(inputs=[])).encode(), "inputs: expected a mapping"),
    "a_list_per_line": (b"[1, 2]", "expected a JSON object per line, found list"),
    "negative_block": (json.dumps(_record(tuned_kernel={"BLOCK_M": -64, "BLOCK_N": -32})).encode(),
                       "tuned_kernel.BLOCK_M: Input should be greater than or equal to 1"),
    "tile_7x3": (json.dumps(_record(tuned_kernel={"BLOCK_M": 7, "BLOCK_N": 3})).encode(),
                 "tile 7x3 is not one the kernels take"),
    "arch_with_newline": (json.dumps(_record(arch="gfx908\nx")).encode(), "arch: String should match"),
}


@pytest.mark.parametrize("case", sorted(TUNING_LOGS))
def test_tune_import_of_a_broken_log_is_one_located_message(tmp_path, case):
    content, why = TUNING_LOGS[case]
    log = tmp_path / "log.json"
    log.write_bytes(content + b"\n")
    out = tmp_path / "out"
    r = invoke(["tune", "import", log, "--out", out, "--date", "2026-11-24"])
    assert r.exit_code == 2, r.output
    assert f"{log}:1: " in r.output and why in r.output, r.output
    assert not out.exists(), "written on error"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "dir", "link_loop"])
def test_tune_import_of_a_log_that_is_not_a_file(tmp_path, kind):
    log = tmp_path / "log.json"
    {"fifo": lambda: os.mkfifo(log), "dir": lambda: log.mkdir(), "link_loop": lambda: log.symlink_to(log)}[kind]()
    r = invoke(["tune", "import", log, "--out", tmp_path / "out"])
    assert r.exit_code == 2, r.output


def test_what_tune_import_writes_the_next_import_reads(tmp_path):
    """Round trip: records at the edges of what is accepted (the smallest and largest tiles, a
    time past float's range, a negative time) are written as CSVs that read back, and a second
    import into the same folder (which reads them) succeeds."""
    from codegen.formats.tuning_csv import MEASUREMENTS_FILE, WINNERS_FILE, read_csv

    recs = [_record(), _record(tuned_kernel={"BLOCK_M": 16, "BLOCK_N": 16}),
            _record(tuned_kernel={"BLOCK_M": 256, "BLOCK_N": 16}, time=[10 ** 400]),
            _record(tuned_kernel={"BLOCK_M": 128, "BLOCK_N": 64}, time=[-1.0])]
    log = tmp_path / "log.json"
    log.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    out = tmp_path / "out"
    for _ in range(2):
        r = invoke(["tune", "import", log, "--out", out, "--date", "2026-11-24"])
        assert r.exit_code == 0, r.output
    rows = read_csv(out / MEASUREMENTS_FILE)
    assert len(rows) == 4 and len(read_csv(out / WINNERS_FILE)) == 1
    assert sorted(r["status"] for r in rows) == ["error", "error", "ok", "ok"]


@pytest.mark.parametrize("content,why", [
    (b"[]", "expected a JSON object with 'configs', found list"),
    (b'{"configs": []}', "configs: expected a mapping"),
    (b'{"arch":"gfx908","gpu":"g","release":"r","triton":"t","configs":{"x.y":{"verdict":"ok","kernels":1}}}',
     "not kernel config names"),
    (b'{"arch":"gfx908","gpu":"g","release":"r","triton":"t","configs":{'
     b'"attn_fwd.gfx908.fp16.d64.M64N32.wpe1.w4.s1.plv0":{"verdict":"spills","kernels":1,"vgpr_spills":-3}}}',
     "vgpr_spills: Input should be greater than or equal to 0"),
    (b'{"arch":"gfx908","gpu":"g","release":"r","triton":"t","configs":{'
     b'"attn_fwd.gfx908.fp16.d64.M64N32.wpe1.w4.s1.plv0":{"verdict":"maybe","kernels":1}}}', "verdict"),
    (b"[" * 100_000, "nested too deeply"),
    (b"\xff", "not UTF-8"),
])
def test_compile_report_of_the_wrong_shape_is_refused(tmp_path, content, why):
    """The spill caps must never silently vanish: a report the model does not accept is an error."""
    from codegen.core.errors import DataFileError
    from codegen.render.inputs import read_compile_report

    p = tmp_path / "compile_report.json"
    p.write_bytes(content)
    with pytest.raises(DataFileError) as exc:
        read_compile_report(p, "compile_report.json")
    assert exc.value.exit_code == 2
    assert all(ln.startswith("compile_report.json") for ln in exc.value.lines), exc.value.lines
    assert why in str(exc.value), str(exc.value)


@pytest.mark.parametrize("arch", ["gfx908", "gfx906", "gfx1030"])
def test_committed_compile_reports_fit_the_model(arch):
    from codegen.render.inputs import committed_report

    report = committed_report(arch)
    raw = json.loads((REPO / "tuning" / arch / "compile_report.json").read_text())
    assert report is not None and report.configs.keys() == raw["configs"].keys()
    assert report.model_dump(mode="json")["configs"] == raw["configs"]


@pytest.mark.parametrize("arch", ["gfx908", "gfx906", "gfx1030"])
def test_the_compile_report_writer_writes_what_it_read(arch, tmp_path):
    """The typed report (codegen.models.limits.CompileReport) written again is the committed file,
    byte for byte: the reader loses nothing and the writer adds nothing."""
    from codegen.compile.prune import write_compile_report
    from codegen.render.inputs import committed_report

    write_compile_report(tmp_path / "r.json", committed_report(arch))
    assert (tmp_path / "r.json").read_bytes() == (REPO / "tuning" / arch / "compile_report.json").read_bytes()


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.aotriton
def test_apply_under_a_memory_limit_is_one_message_exit_3(fresh_tree):
    """A real `apply` under address-space limits from "fails at once" to "enough": each run ends
    0 or 3 (MemoryError, or a thread that cannot start), never a traceback; a failed one leaves
    the tree as it was."""
    import resource

    tree = fresh_tree("0.11b")
    before = _tree_bytes(tree)
    seen = set()
    for kib in (150_000, 160_000, 200_000, 350_000):
        def limit(kib=kib):
            resource.setrlimit(resource.RLIMIT_AS, (kib * 1024, kib * 1024))

        p = subprocess.run([sys.executable, "-c", "from codegen.cli import main; main()", "apply", str(tree)],
                           capture_output=True, text=True, timeout=300, preexec_fn=limit, cwd=REPO)
        out = p.stdout + p.stderr
        assert p.returncode in (0, 3) and "Traceback" not in out, (kib, out[-2000:])
        seen.add(p.returncode)
        if p.returncode == 3:
            assert "out of memory" in out or "cannot start a thread" in out, out
            assert _tree_bytes(tree) == before, f"{kib} KiB: the failed apply changed the tree"
        else:
            break
    assert 3 in seen, "no limit was low enough to fail: lower the first one"


@pytest.mark.slow
@pytest.mark.aotriton
@pytest.mark.triton
def test_precompile_prune_to_the_users_own_spec_keeps_it_byte_identical(fresh_tree, tmp_path):
    """A real run (0.11b, two kernels cross-compiled with this venv's Triton, ~20 s): no config
    fails or spills, so `--prune-to` adds nothing and leaves the user's spec, comment and all,
    byte for byte."""
    pytest.importorskip("triton")
    tree = fresh_tree("0.11b")
    spec = tmp_path / "mine.yaml"
    spec.write_bytes(b"# my own comment, which a rewrite would drop\n" + SPEC.read_bytes())
    before = spec.read_bytes()
    r = invoke(["apply", tree, "--spec", spec])
    assert r.exit_code == 0, r.output
    r = invoke(["precompile", tree, "--spec", spec, "--sample", "2", "--jobs", "1", "--no-cache",
                "--python", sys.executable, "--prune-to", spec])
    assert r.exit_code == 0, r.output
    assert "0 exclude rule(s) added" in r.output
    assert spec.read_bytes() == before


def test_a_relative_python_is_made_absolute(tmp_path, monkeypatch):
    """`--python .venv/bin/python` must still name the same file when the generator or the database
    composer runs with the tree as its working directory (it crashed with FileNotFoundError)."""
    from codegen.core import preflight

    link = tmp_path / "venv" / "bin" / "python"
    link.parent.mkdir(parents=True)
    link.symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    got = preflight.interpreter("venv/bin/python")
    assert got == str(link) and os.path.isabs(got)  # absolute, and not resolved past the venv's link
