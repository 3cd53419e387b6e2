"""The validation report: one dict, written as JSON and as Markdown (pure, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

from codegen.core.fsutil import atomic_write as _atomic_write


def summarize(report: dict) -> dict:
    cases = report.get("cases", [])
    proof_checks = report.get("proof", {}).get("checks", [])
    s = {
        "passed": sum(1 for c in cases if c["status"] == "pass"),
        "failed": sum(1 for c in cases if c["status"] == "fail"),
        "skipped": sum(1 for c in cases if c["status"] == "skip"),
        "proof_failed": sum(1 for c in proof_checks if not c["ok"]),
    }
    s["ok"] = s["failed"] == 0 and s["proof_failed"] == 0 and s["passed"] > 0
    return s


def write_json(report: dict, path: Path) -> None:
    _atomic_write(path, json.dumps(report, indent=2, sort_keys=True) + "\n")


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _short(text: str, n: int = 100) -> str:
    """Kernel names of C++ templates run long; the JSON report keeps them whole."""
    text = text.replace("|", "\\|")
    return text if len(text) <= n else text[: n - 1] + "…"


def render_markdown(r: dict) -> str:
    s = r["summary"]
    L: list[str] = []
    title = "AOTriton kernels (Triton JIT)" if r["mode"] == "kernels" else "PyTorch SDPA flash / memory-efficient"
    L.append(f"# mi100-codegen validate: {title}")
    L.append("")
    L.append(f"**Result: {'PASS' if s['ok'] else 'FAIL'}** — {s['passed']} passed, {s['failed']} failed, "
             f"{s['skipped']} skipped" + (f", {s['proof_failed']} proof checks failed" if s["proof_failed"] else ""))
    L.append("")
    if r.get("label"):
        L.append(f"> {r['label']}")
        L.append("")
    _md_where(r, L)
    if r["mode"] == "sdpa":
        _md_proof(r, L)
    if r["mode"] == "kernels" and r.get("proof", {}).get("checks"):
        L.append("## Negative controls (the checks must reject a wrong answer)")
        L.append("")
        _md_checks(r["proof"]["checks"], L)
    _md_cases(r, L)
    if r.get("perf"):
        _md_perf(r["perf"], L)
    return "\n".join(L) + "\n"


def _md_where(r: dict, L: list[str]) -> None:
    plat = r["platform"]
    L.append("## Where it ran")
    L.append("")
    L.append("| | |")
    L.append("|---|---|")
    for k in ("device_name", "arch_full", "platform", "torch_version", "hip_version", "cuda_version"):
        L.append(f"| {k} | {_fmt(plat.get(k))} |")
    if r.get("triton_version"):
        L.append(f"| triton_version | {r['triton_version']} |")
    sp = r["spec"]
    L.append(f"| spec | {sp['display']} (sha256 {sp['sha256'][:12]}…), arch {sp['arch']}, head dims "
             f"{sp['head_dims']}, dtypes {sp['dtypes']} |")
    if not r.get("arch_matches_spec", True):
        L.append(f"| note | this GPU ({plat.get('arch')}) is not the spec's target ({sp['arch']}) |")
    elif r.get("compute_units_match_spec") is False:
        L.append(f"| note | this GPU has {plat.get('compute_units')} compute units, the spec's hardware "
                 f"{sp.get('compute_units')} |")
    if r["mode"] == "kernels":
        t = r["tree"]
        L.append(f"| AOTriton tree | release {t.get('release')}, tritonsrc sha256 {t['tritonsrc_sha256'][:12]}… |")
        L.append(f"| waves_per_eu | {r['waves_per_eu']} |")
    L.append("")


def _md_checks(checks: list[dict], L: list[str]) -> None:
    L.append("| check | ok | detail |")
    L.append("|---|---|---|")
    for c in checks:
        L.append(f"| {c['what']} | {'yes' if c['ok'] else '**NO**'} | {_short(c['detail'], 200)} |")
    L.append("")


def _md_proof(r: dict, L: list[str]) -> None:
    p = r["proof"]
    L.append("## Proof that the intended kernels ran")
    L.append("")
    a = p.get("aotriton", {})
    L.append(f"- AOTriton file mapped into the process: {', '.join(a.get('mapped_files', [])) or 'none'}")
    if a.get("sha256"):
        L.append(f"- its sha256: `{a['sha256']}`")
    if a.get("images_dir"):
        L.append(f"- images: {a.get('images_files', 0)} files in `{a['images_dir']}`, signature "
                 f"`{a.get('images_signature') or '-'}`")
    for b, k in sorted(p.get("kernels", {}).items()):
        if "error" in k:
            L.append(f"- {b}: error {k['error']}")
            continue
        L.append(f"- {b} forward kernels: {', '.join(f'`{_short(n)}`' for n in k['fwd']) or 'none'}")
        L.append(f"- {b} backward kernels: {', '.join(f'`{_short(n)}`' for n in k['bwd']) or 'none'}")
    L.append("")
    _md_checks(p.get("checks", []), L)
    if r.get("warnings"):
        L.append("Warnings raised by PyTorch:")
        L.append("")
        for w in r["warnings"]:
            L.append(f"- {w.splitlines()[0][:300]}")
        L.append("")


def _md_cases(r: dict, L: list[str]) -> None:
    fails = [c for c in r["cases"] if c["status"] != "pass"]
    if fails:
        L.append("## Failures and skips")
        L.append("")
        L.append("| case | status | reason |")
        L.append("|---|---|---|")
        for c in fails:
            L.append(f"| `{c['name']}` | {c['status']} | {_short(c.get('reason', ''), 240)} |")
        L.append("")
    L.append("## Cases")
    L.append("")
    L.append("| case | status | max error / tolerance |")
    L.append("|---|---|---|")
    for c in r["cases"]:
        errs = ", ".join(f"{x['tensor']} {_fmt(x['max_abs_err'])}/{_fmt(x['tol'])}" for x in c.get("checks", []))
        L.append(f"| `{c['name']}` | {c['status']} | {errs or '-'} |")
    L.append("")


def _md_perf(perf: list[dict], L: list[str]) -> None:
    L.append("## Speed and peak memory (forward + backward, vs the math backend)")
    L.append("")
    sh = perf[0]["shape"]
    L.append(f"Shape: batch {sh['batch']}, heads {sh['heads_q']}, seqlen {sh['seqlen_q']}, not causal; "
             "median of 10 runs.")
    L.append("")
    L.append("| backend | dtype | head dim | fwd ms | fwd+bwd ms | peak MiB | speed-up | memory ratio |")
    L.append("|---|---|---|---|---|---|---|---|")
    for p in perf:
        if "error" in p:
            L.append(f"| {p['backend']} | {p['dtype']} | {p['head_dim']} | {p['error'][:60]} | | | | |")
            continue
        L.append(f"| {p['backend']} | {p['dtype']} | {p['head_dim']} | {_fmt(p['fwd_ms'])} | "
                 f"{_fmt(p['fwd_bwd_ms'])} | {_fmt(p['peak_mib'], 4)} | {_fmt(p.get('speedup_vs_math'))} | "
                 f"{_fmt(p.get('memory_vs_math'))} |")
    L.append("")


def write_markdown(report: dict, path: Path) -> None:
    _atomic_write(path, render_markdown(report))
