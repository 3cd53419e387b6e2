"""The spec's `device_target` (the full target string ROCm reports, e.g. gfx908:sramecc+:xnack-):
its default per arch for the project's specs, explicit values validated, and an unset field kept
out of the spec's meaning hash (the committed overlay records that hash)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from codegen.models import TargetSpec
from codegen.formats.spec import load_spec, spec_sha256
from conftest import REPO


@pytest.mark.parametrize("path,want", [("rules/mi100.yaml", "gfx908:sramecc+:xnack-"),
                                       ("rules/examples/smoke.yaml", "gfx908:sramecc+:xnack-"),
                                       ("rules/mi50.yaml", "gfx906:sramecc+:xnack-"),
                                       ("rules/examples/smoke-mi50.yaml", "gfx906:sramecc+:xnack-"),
                                       ("rules/rdna2.yaml", "gfx1030"),
                                       ("rules/examples/smoke-rdna2.yaml", "gfx1030")])
def test_default_target_string(path, want):
    spec = load_spec(REPO / path).spec
    assert spec.device_target is None and spec.target_string == want


def _with(target):
    doc = yaml.safe_load((REPO / "rules/mi50.yaml").read_text())
    doc["device_target"] = target
    return TargetSpec.model_validate(doc)


def test_explicit_target_string_and_hash():
    base = load_spec(REPO / "rules/mi50.yaml").spec
    radeon7 = _with("gfx906:sramecc-:xnack-")
    assert radeon7.target_string == "gfx906:sramecc-:xnack-"
    assert "device_target" not in base.model_dump() and radeon7.model_dump()["device_target"]
    assert spec_sha256(radeon7) != spec_sha256(base)


@pytest.mark.parametrize("bad,why", [("gfx906:sramecc", "pattern"), ("gfx906:ecc+", "pattern"),
                                     ("gfx908:sramecc+:xnack-", "not a target string of arch 'gfx906'"),
                                     ("gfx906:xnack+:xnack-", "named twice"), ("GFX906", "pattern")])
def test_bad_target_strings(bad, why):
    with pytest.raises(ValidationError, match=why):
        _with(bad)
