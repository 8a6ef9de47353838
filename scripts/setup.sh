#!/usr/bin/env bash
# Installs the Debian 12 packages CentroidKV needs to build, test and run.
# Safe to run twice: it installs only what is missing and never upgrades.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libtbb-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libcpp-httplib-dev libssl-dev openssl
  libopenblas-pthread-dev  # the fit of fitted jobs (kernels/fit/)
  python3 python3-numpy python3-yaml python3-venv
  clang-14 libclang-rt-14-dev llvm-14  # sanitizer builds and fuzz targets (scripts/test-sanitized.sh)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
else
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# What the containers smoke test needs (podman, kubectl, helm) and the Python client's
# environment (.venv; PyPI packages once per machine). The images' build stage copies this
# file alone, so it installs neither there.
here="$(dirname "$0")"
if [ -f "$here/../deploy/setup.sh" ]; then bash "$here/../deploy/setup.sh"; fi
if [ -f "$here/setup_python.sh" ]; then bash "$here/setup_python.sh"; fi
