#!/usr/bin/env bash
# The whole recipe for an MI100 (gfx908) owner: FlashAttention for PyTorch's SDPA.
#
#   1. detect   which AOTriton release line the installed ROCm torch links (torch status)
#   2. clone    the newest release of that line mi100-codegen supports (e.g. 0.12.1b for 0.12b)
#   3. apply    the mi100-codegen overlay (gfx908 registration, tuning space, DB rows)
#   4. build    AOTriton for gfx908 into an install prefix
#   5. install  the build into torch (checks, backup; `mi100-codegen torch restore` undoes it)
#   6. validate on the GPU: JSON + Markdown report, exit 0 only if flash runs and is correct
#
# Each step leaves a marker in $WORKDIR/.done/ and is skipped when rerun, so a failed or
# interrupted run resumes where it stopped. Rerun a step by deleting its marker.
#
# Run it in the Python environment of your ROCm PyTorch. mi100-codegen is not on PyPI: when the
# `mi100-codegen` command is missing, the script installs it from the checkout it lives in
# (`python -m pip install /path/to/mi100-codegen`); or install it yourself first, from a checkout
# (`pip install /path/to/mi100-codegen`) or a built wheel (`pip install mi100_codegen-*.whl`).
#   /path/to/mi100-codegen/scripts/mi100_recipe.sh
# Settings (environment): WORKDIR (default ./mi100-work), JOBS (build parallelism), SPEC (a
# target spec; default the embedded rules/mi100.yaml), AOTRITON_GIT_URL, BUILD_ARGS (extra
# arguments of `mi100-codegen build`), SKIP_KERNEL_CHECK=1 (skip `validate --kernels`).
set -euo pipefail

WORKDIR=${WORKDIR:-$PWD/mi100-work}
AOTRITON_GIT_URL=${AOTRITON_GIT_URL:-https://github.com/ROCm/aotriton.git}
JOBS=${JOBS:-$(nproc)}
SPEC_ARGS=()
if [ -n "${SPEC:-}" ]; then SPEC_ARGS=(--spec "$SPEC"); fi
read -r -a EXTRA_BUILD <<<"${BUILD_ARGS:-}"

mkdir -p "$WORKDIR/.done"
WORKDIR=$(cd "$WORKDIR" && pwd)
log() { printf '\n== %s\n' "$*" >&2; }
done_mark() { [ -e "$WORKDIR/.done/$1" ]; }
mark() { : >"$WORKDIR/.done/$1"; }

PY=$(command -v python3 || command -v python)
if ! command -v mi100-codegen >/dev/null; then
  CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [ ! -f "$CHECKOUT/pyproject.toml" ]; then
    echo "mi100-codegen is not on PATH and $CHECKOUT is not a checkout of it: pip install it into this environment (from a checkout or a built wheel; it is not on PyPI)" >&2
    exit 2
  fi
  log "0/6 install: mi100-codegen from $CHECKOUT (not on PyPI) into $("$PY" -c 'import sys; print(sys.prefix)')"
  "$PY" -m pip install "$CHECKOUT" >&2
  hash -r
  command -v mi100-codegen >/dev/null || { echo "installed, but mi100-codegen is still not on PATH (is $PY this environment's python?)" >&2; exit 2; }
fi

# 1. detect ---------------------------------------------------------------------------------------
log "1/6 detect: the AOTriton release this torch links"
STATUS_JSON="$WORKDIR/torch-status.json"
mi100-codegen torch status --json >"$STATUS_JSON"
mi100-codegen torch status >&2
# LINKED: the release libtorch_hip.so links; TAG: the newest release of that line we support
# (point releases are ABI-compatible; `torch install` keeps the file name torch links).
LINKED=$("$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s.get("release_tag") or "")' "$STATUS_JSON")
TAG=$("$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s.get("build_release") or "")' "$STATUS_JSON")
ROCM=$("$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(int(bool(s["rocm_build"])))' "$STATUS_JSON")
if [ "$ROCM" != 1 ] || [ -z "$LINKED" ]; then
  echo "this torch is not a ROCm build linking libaotriton_v2.so.X.Y.Z; install a ROCm wheel of PyTorch first" >&2
  exit 2
fi
if [ -z "$TAG" ]; then
  "$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s.get("build_release_problem") or "")' "$STATUS_JSON" >&2
  exit 2
fi
TREE="$WORKDIR/aotriton-$TAG"
PREFIX="$WORKDIR/prefix-$TAG"
echo "torch links AOTriton $LINKED; building $TAG: tree $TREE, install prefix $PREFIX" >&2

# 2. clone ----------------------------------------------------------------------------------------
if done_mark "clone-$TAG"; then log "2/6 clone: done"; else
  log "2/6 clone: AOTriton $TAG"
  if [ ! -d "$TREE/.git" ]; then
    rm -rf "$TREE.partial"
    git clone --depth 1 --branch "$TAG" "$AOTRITON_GIT_URL" "$TREE.partial"
    mv "$TREE.partial" "$TREE"
  fi
  mark "clone-$TAG"
fi

# 3. apply ----------------------------------------------------------------------------------------
if done_mark "apply-$TAG"; then log "3/6 apply: done"; else
  log "3/6 apply: the gfx908 overlay"
  mi100-codegen apply "$TREE" "${SPEC_ARGS[@]}"
  mark "apply-$TAG"
fi

# 4. build ----------------------------------------------------------------------------------------
if done_mark "build-$TAG"; then log "4/6 build: done"; else
  log "4/6 build: AOTriton for gfx908 into $PREFIX (long: hours on few cores)"
  mi100-codegen build "$TREE" --prefix "$PREFIX" --jobs "$JOBS" "${SPEC_ARGS[@]}" "${EXTRA_BUILD[@]}"
  mark "build-$TAG"
fi

# 5. install --------------------------------------------------------------------------------------
if done_mark "install-$TAG"; then log "5/6 install: done"; else
  log "5/6 install: into torch (backup kept; undo with: mi100-codegen torch restore)"
  mi100-codegen torch install --prefix "$PREFIX" "${SPEC_ARGS[@]}"
  mark "install-$TAG"
fi

# 6. validate -------------------------------------------------------------------------------------
log "6/6 validate: on this GPU"
rc=0
if [ "${SKIP_KERNEL_CHECK:-0}" != 1 ]; then
  mi100-codegen validate --kernels "$TREE" "${SPEC_ARGS[@]}" \
    --json "$WORKDIR/kernels-report.json" --md "$WORKDIR/kernels-report.md" || rc=$?
fi
mi100-codegen validate "${SPEC_ARGS[@]}" --json "$WORKDIR/report.json" --md "$WORKDIR/report.md" || rc=$?
if [ "$rc" -eq 0 ]; then
  echo "done: flash attention runs on this GPU; report $WORKDIR/report.md" >&2
else
  echo "validation failed (exit $rc): see $WORKDIR/report.md; undo the install with: mi100-codegen torch restore" >&2
fi
exit "$rc"
