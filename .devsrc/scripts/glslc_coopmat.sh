#!/usr/bin/env bash
# A second glslc, for the kernels that need GLSL extensions Debian 12's glslc (shaderc
# 2023.2) does not know: GL_KHR_cooperative_matrix (tensor cores) and GL_EXT_bfloat16.
# It comes from Debian's archive only: sid's glslc and libshaderc1 with the C and C++
# runtimes they are built against (libc6, libstdc++6, libgcc-s1), fetched with
# `apt-get download` under a private apt configuration (the system's sources and state
# are untouched), unpacked with `dpkg -x` into a directory of their own, and run through
# a wrapper under sid's own ld-linux, so that nothing of the system is replaced.
#
#   scripts/glslc_coopmat.sh install DEST    fetch, unpack into DEST, wrapper DEST/glslc-coopmat
#   scripts/glslc_coopmat.sh debs DIR        fetch the .debs into DIR only (the device kit)
#   scripts/glslc_coopmat.sh unpack DIR DEST unpack DIR's .debs into DEST, wrapper as install
#
# Each mode ends by compiling a probe kernel with the wrapper; a failure exits non-zero
# with one line saying what failed (scripts/setup.sh treats that as "baseline kernels only").
set -euo pipefail
PKGS="glslc libshaderc1 libc6 libstdc++6 libgcc-s1"
SUITE=${DYNAMO_VULKAN_GLSLC_SUITE:-sid}
MIRROR=${DYNAMO_VULKAN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
fail() { echo "[glslc-coopmat] $*" >&2; exit 1; }
source "$(dirname "$0")/sid_apt.sh"

fetch() {   # fetch DIR: the packages' .debs from $SUITE into DIR
  local dir=$1
  sid_apt_setup
  mkdir -p "$dir"
  apt-get "${APT_OPTS[@]}" -qq update >/dev/null 2>"$APT_DIR/err" || { cat "$APT_DIR/err" >&2; rm -rf "$APT_DIR"; fail "apt-get update of $SUITE failed"; }
  rm -f "$dir"/*.deb
  (cd "$dir" && apt-get "${APT_OPTS[@]}" -qq download $PKGS >/dev/null 2>"$APT_DIR/err") \
    || { cat "$APT_DIR/err" >&2; rm -rf "$APT_DIR"; fail "apt-get download $PKGS from $SUITE failed"; }
  rm -rf "$APT_DIR"
}

unpack() {  # unpack DIR DEST: the .debs of DIR into DEST, and the wrapper
  local dir=$1 dest=$2
  ls "$dir"/glslc_*.deb >/dev/null 2>&1 || fail "no glslc .deb in $dir"
  rm -rf "$dest/root"
  mkdir -p "$dest/root"
  for f in "$dir"/*.deb; do dpkg -x "$f" "$dest/root"; done
  local root lib
  root=$(cd "$dest/root" && pwd)
  lib=$root/usr/lib/x86_64-linux-gnu
  [ -x "$lib/ld-linux-x86-64.so.2" ] || fail "no ld-linux-x86-64.so.2 in the unpacked libc6"
  cat > "$dest/glslc-coopmat" <<EOF
#!/bin/sh
# sid's glslc under sid's own loader and libraries (scripts/glslc_coopmat.sh)
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$root/usr/bin/glslc" "\$@"
EOF
  chmod +x "$dest/glslc-coopmat"
}

probe() {   # probe WRAPPER: it compiles a cooperative-matrix bf16 kernel
  local wrap=$1 d
  d=$(mktemp -d)
  cat > "$d/probe.comp" <<'EOF'
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_bfloat16 : require
layout(local_size_x = 32) in;
layout(binding = 0) buffer O { float o[]; };
shared bfloat16_t s[256];
void main() {
  s[gl_LocalInvocationID.x] = bfloat16_t(1.0);
  barrier();
  coopmat<bfloat16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
  coopmat<bfloat16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
  coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c =
      coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
  coopMatLoad(a, s, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  coopMatLoad(b, s, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  c = coopMatMulAdd(a, b, c);
  coopMatStore(c, o, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
}
EOF
  if ! "$wrap" --target-env=vulkan1.1 -O "$d/probe.comp" -o "$d/probe.spv" 2>"$d/err"; then
    cat "$d/err" >&2; rm -rf "$d"; fail "$wrap cannot compile a cooperative-matrix bf16 kernel"
  fi
  rm -rf "$d"
}

case "${1:-}" in
  install)
    dest=${2:?install DEST}
    if [ -x "$dest/glslc-coopmat" ] && probe "$dest/glslc-coopmat" 2>/dev/null; then exit 0; fi
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    fetch "$tmp"
    unpack "$tmp" "$dest"
    probe "$dest/glslc-coopmat"
    echo "[glslc-coopmat] $("$dest/glslc-coopmat" --version | head -1) in $dest" >&2 ;;
  debs) fetch "${2:?debs DIR}" ;;
  unpack)
    unpack "${2:?unpack DIR DEST}" "${3:?unpack DIR DEST}"
    probe "$3/glslc-coopmat" ;;
  *) fail "usage: $0 install DEST | debs DIR | unpack DIR DEST" ;;
esac
