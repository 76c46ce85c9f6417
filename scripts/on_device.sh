#!/usr/bin/env bash
# On the lent GPU machine (no glslc, no venv): make Vulkan, glslc and our
# patched kp usable with the machine's own python3, then run "$@".
# Needs the device kit copied to .device-kit (with glslc/libshaderc1 .debs).
# "$@" runs in /tmp, so it imports the installed copy of this tree (/tmp/dvk); to time
# another version beside it, give both to `python3 -m dynamo_vulkan.benchmarks.ab`
# (--tree A=DIR --tree B=/tmp/dvk), which checks that each run imports its own tree.
set -eo pipefail
source .device-kit/on-device.sh
for f in .device-kit/glslc_*.deb .device-kit/libshaderc1_*.deb; do dpkg -x "$f" /tmp/vkdev; done
export PATH=/tmp/vkdev/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/vkdev/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
# the second glslc (Debian sid's) for the tensor-core kernels, where the kit carries it
if ls .device-kit/glslc-coopmat/glslc_*.deb >/dev/null 2>&1; then
  if bash scripts/glslc_coopmat.sh unpack .device-kit/glslc-coopmat /tmp/glslc-coopmat; then
    export DYNAMO_VULKAN_GLSLC_COOPMAT=/tmp/glslc-coopmat/glslc-coopmat
  else
    echo "on_device: sid's glslc did not run: tensor-core kernels off" >&2
  fi
fi
KP_PATCHES=$(python3 scripts/patch_kp.py --patch-set)
if ! PYTHONPATH=/tmp/kp2 python3 -c 'import kp, sys; assert kp.dynamo_vulkan_patches == int(sys.argv[1])' "$KP_PATCHES" 2>/dev/null; then
  rm -rf /tmp/kpb && mkdir -p /tmp/kpb && tar xzf .device-kit/kp-0.9.0.tar.gz -C /tmp/kpb
  python3 scripts/patch_kp.py /tmp/kpb/kp-0.9.0
  rm -rf /tmp/kp2   # pip --target keeps an older kp in place
  KOMPUTE_OPT_USE_BUILT_IN_VULKAN_HEADER=OFF KOMPUTE_OPT_USE_BUILT_IN_FMT=OFF \
  KOMPUTE_OPT_USE_BUILT_IN_PYBIND11=OFF KOMPUTE_OPT_DISABLE_VULKAN_VERSION_CHECK=ON KOMPUTE_OPT_INSTALL=OFF \
  CMAKE_PREFIX_PATH=/tmp/vkdev/usr:$(python3 -c "import pybind11;print(pybind11.get_cmake_dir())") \
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/kp2 \
    /tmp/kpb/kp-0.9.0 > /tmp/kp-build.log 2>&1 || { tail -30 /tmp/kp-build.log; exit 1; }
fi
# install the project (its entry point registers the backend) without dependencies
rm -rf /tmp/dvk && python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/dvk . \
  > /tmp/dvk-install.log 2>&1 || { tail -20 /tmp/dvk-install.log; exit 1; }
# pure-python / abi3 dependencies the GPU machine lacks (gguf, tokenizers, ...), carried as
# wheels in .device-kit/wheels (pip download --python-version 3.12 --only-binary=:all:)
if ls .device-kit/wheels/*.whl >/dev/null 2>&1 && [ ! -d /tmp/dvk-deps ]; then
  python3 -m pip install -q --no-deps --target /tmp/dvk-deps .device-kit/wheels/*.whl
fi
export PYTHONPATH=/tmp/kp2:/tmp/dvk:/tmp/dvk-deps:$PWD/tests:$PYTHONPATH
# The machine's python runs with PYTHONDONTWRITEBYTECODE and its torch carries no bytecode
# caches, so every process would compile torch's modules from source, which a user's pip
# install does not pay (it writes them): write them once, under /tmp, and use them.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
if [ ! -e /tmp/pycache/.done ]; then
  python3 -m compileall -q -j 0 "$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')" \
    /tmp/dvk /tmp/dvk-deps > /tmp/compileall.log 2>&1 || true
  touch /tmp/pycache/.done
fi
cd /tmp   # import the installed copy, not the source tree
"$@"
