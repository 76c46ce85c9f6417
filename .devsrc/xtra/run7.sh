K=$S/.device-kit/skel
export DYNAMO_VULKAN_MATMUL_PRECISION=high LAYERS=4 N=8
for v in 8 4; do
  DYNAMO_VULKAN_CACHE_DIR=/tmp/c7_$v PATCH="dynamo_vulkan.lowering.core:SPLIT_K_MAX_BYTES=$v<<20" TAG=cap$v \
    python3 $S/xtra/prefill_ab.py $K/llama-7b.json.gz 128 2>&1 | grep RESULT | tee -a $OUT/ab.txt
done
