#!/usr/bin/env bash
# A software Vulkan device with cooperative matrices, to run the tensor-core kernels'
# tests on a machine without a GPU: Debian sid's lavapipe (Mesa 26.2 has fp16 x fp16 + fp32
# cooperative matrices, 8x8x8, subgroups of 8; no bf16 ones, which tests/test_coopmat.py
# then runs with each bf16 value held in fp16). Debian 12's Mesa 22.3 has none.
# It comes from Debian's archive only: mesa-vulkan-drivers and what it needs that is newer
# than Debian 12's (the C/C++ runtimes, LLVM, ...), fetched with `apt-get download` under a
# private apt configuration (the system's sources and state untouched), unpacked with
# `dpkg -x` into a directory of their own; a wrapper runs a program under sid's loader with
# sid's libraries first and that lavapipe as the only Vulkan driver.
#
#   scripts/lavapipe_coopmat.sh install DEST      fetch and unpack into DEST, wrapper DEST/run
#   DEST/run .venv/bin/python -m pytest -q tests/test_coopmat.py
#
# The first run of each kernel variant is slow (LLVM compiles the large unrolled kernel;
# Mesa caches it on disk after).
set -euo pipefail
SUITE=${DYNAMO_VULKAN_LAVAPIPE_SUITE:-sid}
MIRROR=${DYNAMO_VULKAN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
fail() { echo "[lavapipe-coopmat] $*" >&2; exit 1; }
source "$(dirname "$0")/sid_apt.sh"

# the names in a Depends line: first alternative of each, without versions or arch
dep_names() { tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/:any//' -e 's/[[:space:]]//g' | grep -v '^$'; }

install() {
  local dest=$1 apt
  sid_apt_setup
  apt=$APT_DIR
  trap 'rm -rf "$apt"' RETURN
  mkdir -p "$apt/debs"
  local opts=("${APT_OPTS[@]}")
  apt-get "${opts[@]}" -qq update >/dev/null || fail "apt-get update of $SUITE failed"
  depends() { apt-cache "${opts[@]}" show "$1" | sed -n 's/^Depends: //p' | head -1 | dep_names; }
  # mesa's own dependencies and its LLVM's; the Vulkan loader stays the system's
  local pkgs llvm
  pkgs=$(depends mesa-vulkan-drivers | grep -v -e '^libvulkan1$' -e '^python3')
  llvm=$(echo "$pkgs" | grep '^libllvm' | head -1)
  [ -n "$llvm" ] || fail "mesa-vulkan-drivers in $SUITE depends on no libllvm"
  pkgs=$(printf '%s\n' mesa-vulkan-drivers $pkgs $(depends "$llvm") | sort -u)
  (cd "$apt/debs" && apt-get "${opts[@]}" -qq download $pkgs >/dev/null) \
    || fail "apt-get download from $SUITE failed: $(echo $pkgs)"
  rm -rf "$dest/root"
  mkdir -p "$dest/root"
  for f in "$apt"/debs/*.deb; do dpkg -x "$f" "$dest/root"; done
  local root lib
  root=$(cd "$dest/root" && pwd)
  lib=$root/usr/lib/x86_64-linux-gnu
  [ -x "$lib/ld-linux-x86-64.so.2" ] || fail "no ld-linux-x86-64.so.2 in the unpacked libc6"
  [ -f "$lib/libvulkan_lvp.so" ] || fail "no libvulkan_lvp.so in mesa-vulkan-drivers"
  if "$lib/ld-linux-x86-64.so.2" --library-path "$lib:/usr/lib/x86_64-linux-gnu" --list "$lib/libvulkan_lvp.so" \
      2>&1 | grep -q "cannot open\|not found"; then
    fail "lavapipe's libraries are incomplete: $("$lib/ld-linux-x86-64.so.2" --library-path "$lib" --list "$lib/libvulkan_lvp.so" 2>&1 | head -3)"
  fi
  local api
  api=$(sed -n 's/.*"api_version": *"\([0-9.]*\)".*/\1/p' "$root/usr/share/vulkan/icd.d/lvp_icd.json" | head -1)
  cat > "$dest/lvp_icd.json" <<EOF
{"ICD": {"api_version": "${api:-1.3.0}", "library_path": "$lib/libvulkan_lvp.so"}, "file_format_version": "1.0.1"}
EOF
  cat > "$dest/run" <<EOF
#!/bin/sh
# "\$@" under sid's loader and libraries, with sid's lavapipe as the only Vulkan driver
# (scripts/lavapipe_coopmat.sh)
export VK_ICD_FILENAMES="$(cd "$dest" && pwd)/lvp_icd.json" VK_DRIVER_FILES="$(cd "$dest" && pwd)/lvp_icd.json"
prog=\$(command -v "\$1") || { echo "no program \$1" >&2; exit 127; }
shift
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib:/usr/lib/x86_64-linux-gnu" "\$prog" "\$@"
EOF
  chmod +x "$dest/run"
  echo "[lavapipe-coopmat] $(ls "$apt"/debs | grep mesa-vulkan) in $dest; run programs with $dest/run" >&2
}

case "${1:-}" in
  install) install "${2:?install DEST}" ;;
  *) fail "usage: $0 install DEST" ;;
esac
