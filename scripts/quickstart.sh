#!/usr/bin/env bash
# Newcomer quickstart: install mi100-codegen into a venv and render the default MI100 overlay.
# Usage: scripts/quickstart.sh [VENV_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$here/.venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q "$here"
"$venv/bin/mi100-codegen" spec check
"$venv/bin/mi100-codegen" render --out "$here/aotriton_overlay" --check
echo "ok: $venv/bin/mi100-codegen is ready; next: mi100-codegen apply <aotriton checkout>"
