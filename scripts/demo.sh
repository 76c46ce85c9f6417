#!/usr/bin/env bash
# Set up (idempotent) and run the main job: a transformer block compiled with
# backend="vulkan", checked against eager CPU, both timings printed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m dynamo_vulkan.demo "$@"
