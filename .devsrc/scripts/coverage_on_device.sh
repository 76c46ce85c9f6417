#!/usr/bin/env bash
# The OpInfo coverage run on the lent GPU machine, in SHARDS parallel processes of
# the first SAMPLES samples per op (SAMPLES=all: every sample), the shards' JSON in
# $OUT/coverage-gpu.tgz and their merged report in $OUT/ops-gpu.md (merge shards
# yourself with  python -m dynamo_vulkan.coverage --merge DIR/*.json --out FILE).
# Run through scripts/on_device.sh with .device-kit and .cov-carry (expecttest wheel)
# carried:  bash scripts/on_device.sh bash scripts/coverage_on_device.sh
set -eo pipefail
SHARDS=${SHARDS:-8}
SAMPLES=${SAMPLES:-6}
LIMIT=${LIMIT:-300}
R=${REPO:-$OLDPWD}
python3 -m pip install -q --no-deps --no-index --target /tmp/covextra "$R"/.cov-carry/*.whl \
  "$R"/.device-kit/wheels/tqdm-*.whl > /tmp/covextra.log 2>&1 || { cat /tmp/covextra.log; exit 1; }
export PYTHONPATH=/tmp/covextra:$PYTHONPATH
export DYNAMO_VULKAN_CACHE_DIR=/tmp/dvk-coverage-cache
python3 -c 'import torch, dynamo_vulkan; print(torch.__version__, dynamo_vulkan.device_info()["name"])'
CAP=(--max-samples "$SAMPLES"); [ "$SAMPLES" = all ] && CAP=()
W=/tmp/coverage-gpu; rm -rf "$W"; mkdir -p "$W"
for i in $(seq 0 $((SHARDS - 1))); do
  timeout "$LIMIT" python3 -m dynamo_vulkan.coverage --shard "$i/$SHARDS" "${CAP[@]}" \
    --json "$W/gpu_$i.json" --no-progress > "$W/gpu_$i.log" 2>&1 &
done
wait || true
tail -qn 1 "$W"/gpu_*.log
python3 -m dynamo_vulkan.coverage --merge "$W"/gpu_*.json --out "$OUT/ops-gpu.md"
tar czf "$OUT/coverage-gpu.tgz" -C "$W" .
