#!/usr/bin/env bash
# The GPU suite on the lent GPU machine, in one `run` call: install the carried wheels,
# run benchmarks.gpu_standalone (torch + open_clip only: no Ray, no MLflow), write the
# JSON and the log to $OUT.
#
#   run(command="bash infra/device/gpu_suite.sh", carry=[".whl"], timeout_s=600)
#
# Environment (all optional):
#   OUT             where gpu_suite.json and gpu_suite.log go (the device tool sets it; default ./outputs/gpu_suite)
#   WHEELS          folder of carried wheels (default .whl; made by infra/device/fetch_wheels.sh); skipped when absent
#   DEVICE          cuda (default) or cpu (the local check of this script)
#   GPU_SUITE_ARGS  extra flags (default: --arch ViT-B-32 --batch 256 --steps 10)
#   PYTHON          interpreter (default python3: on the GPU machine, the one that holds torch)
#   HARDPOS_COMMIT  the commit to record in the JSON (the machine's copy of the tree has no .git)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-outputs/gpu_suite}
WHEELS=${WHEELS:-.whl}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
LOG="$OUT/gpu_suite.log"
: > "$LOG"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  SITE=$(mktemp -d /tmp/hardpos-site.XXXXXX)
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    2>&1 | tee -a "$LOG"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  echo "installed $(ls "$WHEELS"/*.whl | wc -l) carried wheel(s) into $SITE" | tee -a "$LOG"
fi
export PYTHONPATH="$PWD/platform${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
command -v nvidia-smi > /dev/null && nvidia-smi 2>&1 | tee -a "$LOG" || true
# shellcheck disable=SC2086  # GPU_SUITE_ARGS is a list of flags
"$PYTHON" -m benchmarks.gpu_standalone --device "${DEVICE:-cuda}" \
  ${GPU_SUITE_ARGS:---arch ViT-B-32 --batch 256 --steps 10} --out "$OUT/gpu_suite.json" 2>&1 | tee -a "$LOG"
