#!/usr/bin/env bash
# Fill .whl/ with what bench/gpu_check.sh needs beyond a CUDA machine's own Python 3.12 stack
# (torch, transformers, tokenizers, safetensors, numpy, httpx, pytest there already): the GPU
# machine has no internet, so these travel with the working tree. The stages import only
# slimeish.{trainer,engine,models,common}, whose third-party imports outside that stack are
# megatron-core (the trainer) and msgspec (the engine's protocol); transformers travels too, so the
# tiny models are built by the version CI pins, not the machine's own. Versions are pyproject's pins.
#   bash bench/gpu_check_wheels.sh            # then: du -sh .whl
set -euo pipefail
cd "$(dirname "$0")/.."
PINS=(megatron-core==0.16.1 msgspec==0.22.0 transformers==5.23.0)
for pin in "${PINS[@]}"; do
  grep -q "\"$pin\"" pyproject.toml || { echo "gpu_check_wheels: $pin is not pyproject's pin" >&2; exit 1; }
done
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${PINS[@]}"
ls -l .whl
