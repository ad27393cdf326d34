#!/usr/bin/env bash
# Installs what building and testing zenflow needs on Debian/Ubuntu, skipping what is there:
# a C++20 compiler, CMake, Ninja, make and pkg-config (the package test), oneTBB, xsimd and doctest; with --fuzz also clang and its
# libFuzzer runtime. The CUDA toolkit is optional and not installed here (the host library
# builds and tests without it).
set -euo pipefail
pkgs=(g++ cmake ninja-build make pkg-config libtbb-dev libxsimd-dev doctest-dev)
if [ "${1:-}" = "--fuzz" ]; then pkgs+=(clang libclang-rt-dev); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "zenflow dependencies: all present"
  exit 0
fi
echo "zenflow dependencies: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
