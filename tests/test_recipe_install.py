"""mi100-codegen is not on PyPI: the recipe script installs it from the checkout it lives in when
the command is missing (`python -m pip install CHECKOUT`), then goes on with the recipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_torch_install import build_torch, need_cc

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "mi100_recipe.sh"


def test_missing_command_is_installed_from_the_checkout(tmp_path):
    need_cc()
    site = tmp_path / "site"
    build_torch(site, version="2.11.0+cu128", hip=None, hip_lib=False, images=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "pip.log"
    # a python3 whose `-m pip install X` records X and puts the mi100-codegen command on PATH
    (bin_dir / "python3").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = pip ]; then\n'
        f'  echo "$@" >> {log}\n'
        f"  printf '#!/bin/sh\\nexec {sys.executable} -m codegen.cli \"$@\"\\n' > {bin_dir}/mi100-codegen\n"
        f"  chmod +x {bin_dir}/mi100-codegen\n"
        "  exit 0\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    (bin_dir / "python3").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=f"{site}:{REPO}", WORKDIR=str(tmp_path / "work"),
               PATH=f"{bin_dir}:/usr/bin:/bin")
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert log.read_text().split() == ["-m", "pip", "install", str(REPO)]
    assert "not on PyPI" in r.stderr
    # the recipe went on to its first step with the installed command (this torch is not ROCm)
    assert r.returncode == 2 and "not a ROCm build" in r.stderr, r.stderr
