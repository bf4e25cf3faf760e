#!/usr/bin/env bash
# Download the wheels the GPU suite needs on the lent GPU machine into .whl/ (gitignored).
#
# That machine has torch, torchvision, timm, huggingface_hub, safetensors, regex, tqdm, numpy,
# pillow, pyyaml and pyarrow, but no package registry; open_clip_torch and ftfy (+ wcwidth)
# are missing and travel as wheels, with pydantic's (~4 MB together). Its Python is 3.12.
# open_clip_torch's version is the one infra/docker/constraints.txt pins.
#
#   bash infra/device/fetch_wheels.sh      # run here, from the repository root, once
#
# Then `run` the suite with carry [".whl"] (see docs/performance.md, "GPU suite").
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OPEN_CLIP=$(grep -E '^open_clip_torch==' infra/docker/constraints.txt | cut -d= -f3)
mkdir -p .whl
# pydantic (+ its core and typing helpers): the Serve request models that compute_batch's image
# checks live beside; versions as installed here.
PYD=()
for name in pydantic pydantic-core typing-inspection annotated-types typing-extensions; do
  PYD+=("${name}==$("$PY" -c "import importlib.metadata as m; print(m.version('${name}'))")")
done
for req in "open_clip_torch==${OPEN_CLIP}" "ftfy==6.3.1" "wcwidth==0.2.13" "${PYD[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$req"
done
ls -la .whl
