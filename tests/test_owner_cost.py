"""The build-cost table `torch install --bundle auto` estimates a local build from
(codegen.imagebuild.cost) is the measured one of docs/measurements.md: each row's kernels and cold
CPU-seconds, read from the log's table; a release without a row takes its line's."""

from __future__ import annotations

import re
from pathlib import Path

from codegen.imagebuild.cost import BUILD_COST, REST_CPU_S, build_cost, estimate_s

LOG = Path(__file__).resolve().parents[1] / "docs" / "measurements.md"
ROW = re.compile(r"^\s*\| (\S+) \| gfx\w+ \(`(\w+)`\) \| ([\d,]+)(?:<!--[^>]*-->)? \| \d+ \| [^|]+ \| ([\d,]+) \|")


def test_the_table_is_the_measured_one():
    text = LOG.read_text(encoding="utf-8")
    section = text[text.index("— image-build cost per release and target"):]
    section = section[:section.index("\n## ")]
    rows = {(m[1], m[2]): (int(m[3].replace(",", "")), int(m[4].replace(",", "")))
            for m in map(ROW.match, section.splitlines()) if m}
    assert len(rows) == 13
    assert {(c.release, c.spec): (c.kernels, c.cpu_s) for c in BUILD_COST} == rows


def test_releases_without_a_row_take_their_lines():
    assert build_cost("0.11b", "mi100").cpu_s == 2695
    assert build_cost("0.11.2b", "mi100").release == "0.11b"
    assert build_cost("0.11.2b", "rdna2").release == "0.11.1b"     # the newest row of the line not newer
    assert build_cost("0.12b", "mi50").release == "0.12.1b"        # only a newer row in the line
    assert build_cost("0.14.0-dev", "mi100").release == "0.13b"
    assert build_cost("0.11b", "smoke") is None
    c = build_cost("0.13b", "mi100")
    assert estimate_s(c, 16) == (c.cpu_s + REST_CPU_S) / 16 and estimate_s(c, 0) == c.cpu_s + REST_CPU_S
