#!/usr/bin/env bash
# Installs what building and testing zenflow needs on Debian/Ubuntu, skipping what is there:
# a C++20 compiler, CMake, Ninja, make and pkg-config (the package test), oneTBB, xsimd and
# doctest, Open MPI (the data-parallel tests), NCCL where the CUDA toolkit lacks it (the
# nvidia-nccl-cu12 or -cu13 wheel, as the toolkit), and Conan 2 (the Conan package test: from PyPI, into its own virtual environment under
# ${ZENFLOW_TOOLS_DIR:-~/.cache/zenflow-tools}, not the system's Python); with --fuzz also clang
# and its libFuzzer runtime. The CUDA toolkit is optional and not installed here (the host library
# builds and tests without it).
set -euo pipefail
pkgs=(g++ cmake ninja-build make pkg-config libtbb-dev libxsimd-dev doctest-dev python3 python3-venv
  libopenmpi-dev openmpi-bin)
if [ "${1:-}" = "--fuzz" ]; then pkgs+=(clang libclang-rt-dev); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "zenflow dependencies: all present"
else
  echo "zenflow dependencies: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

tools="${ZENFLOW_TOOLS_DIR:-$HOME/.cache/zenflow-tools}"
if [ -x "$tools/venv/bin/conan" ]; then
  echo "zenflow dependencies: conan present ($("$tools/venv/bin/conan" --version))"
else
  echo "zenflow dependencies: installing conan into $tools/venv"
  /usr/bin/python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install -q --disable-pip-version-check "conan>=2,<3"
fi

# NCCL for zenflow::nccl (data parallel on the CUDA space): only where the CUDA toolkit is present
# and has no NCCL of its own; then NVIDIA's nvidia-nccl-cu<CUDA major> wheel (nccl.h and
# libnccl.so.2) goes into the same virtual environment, where cmake/FindNCCL.cmake looks.
nvcc_bin="$(command -v nvcc || true)"
[ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc_bin" ]; then
  cuda_root="$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")"
  if [ -f "$cuda_root/include/nccl.h" ] || [ -f /usr/include/nccl.h ]; then
    echo "zenflow dependencies: NCCL present (with the CUDA toolkit or the system)"
  elif compgen -G "$tools/venv/lib/python3*/site-packages/nvidia/nccl/include/nccl.h" > /dev/null; then
    echo "zenflow dependencies: NCCL present (an nvidia-nccl wheel in $tools/venv)"
  else
    # the wheel built for this toolkit's CUDA major version (a library built for another one may
    # not load with this toolkit's runtime)
    cuda_major="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p' | head -n 1)"
    case "$cuda_major" in
      12 | 13)
        echo "zenflow dependencies: installing nvidia-nccl-cu$cuda_major into $tools/venv (CUDA $cuda_major)"
        "$tools/venv/bin/pip" install -q --disable-pip-version-check "nvidia-nccl-cu$cuda_major>=2.27"
        ;;
      *)
        echo "zenflow dependencies: no NCCL wheel for CUDA '${cuda_major:-unknown}' (12 and 13 have one);" \
          "zenflow::nccl is built only where NCCL is found (install it, or set NCCL_ROOT)"
        ;;
    esac
  fi
fi
