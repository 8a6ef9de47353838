#!/usr/bin/env bash
# Verifies the centroidkv package's oldest supported dependency versions (the lower bounds,
# OLDEST in setup.py): a throwaway virtual environment under /tmp with exactly those versions from
# PyPI, the package built there with stubs from the matching grpcio-tools, and the pytest
# suite's tests that need no torch against a real centroidkv-server. Not part of the suite
# (it downloads from PyPI); run it when a lower bound changes.
#
# Usage: client/python/check_oldest.sh [BIN_DIR [SHARED_DIR]]
#   BIN_DIR    holds centroidkv-server (default: build/bin of this checkout)
#   SHARED_DIR the shared folder with golden/ (default: ../shared next to the checkout)
# Versions (defaults: the lower bounds, setup.py's OLDEST; override to bisect):
#   CKV_GRPCIO, CKV_PROTOBUF, CKV_NUMPY, CKV_GRPCIO_TOOLS (default: CKV_GRPCIO),
#   CKV_SETUPTOOLS (default ">=68,<82": grpcio-tools before 1.62 import pkg_resources)
#   CKV_PYTHON (default /usr/bin/python3), CKV_KEEP_VENV=1 keeps the environment.
#   CKV_TORCH, CKV_TRANSFORMERS (default: unset): also install these versions of the extras
#   (torch from PyPI brings its CUDA wheels, gigabytes) and run the whole suite, the torch and
#   transformers tests included.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin_dir=$(cd "${1:-$repo/build/bin}" && pwd)
shared_dir=$(cd "${2:-$repo/../shared}" && pwd)
grpcio=${CKV_GRPCIO:-1.49.1}
protobuf=${CKV_PROTOBUF:-4.21.3}
numpy=${CKV_NUMPY:-1.23.2}
grpcio_tools=${CKV_GRPCIO_TOOLS:-$grpcio}
setuptools=${CKV_SETUPTOOLS:->=68,<82}
python=${CKV_PYTHON:-/usr/bin/python3}
torch=${CKV_TORCH:-}
transformers=${CKV_TRANSFORMERS:-}

if [ ! -x "$bin_dir/centroidkv-server" ]; then
  echo "check_oldest: $bin_dir/centroidkv-server is missing; build it first" >&2
  exit 1
fi
work=$(mktemp -d /tmp/ckv-oldest.XXXXXX)
if [ "${CKV_KEEP_VENV:-0}" != 1 ]; then trap 'rm -rf "$work"' EXIT; fi
echo "check_oldest: grpcio $grpcio, grpcio-tools $grpcio_tools, protobuf $protobuf," \
  "numpy $numpy in $work/venv ($("$python" --version))"
"$python" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --only-binary=:all: "grpcio==$grpcio" "grpcio-tools==$grpcio_tools" \
  "protobuf==$protobuf" "numpy==$numpy" "setuptools$setuptools" wheel "pytest>=7"
extras=()
if [ -n "$torch" ]; then extras+=("torch==$torch"); fi
if [ -n "$transformers" ]; then extras+=("transformers==$transformers"); fi
if [ ${#extras[@]} -gt 0 ]; then
  echo "check_oldest: extras ${extras[*]}"
  # numpy stays pinned: pip must not move a version under test.
  "${pip[@]}" install --only-binary=:all: "${extras[@]}" "numpy==$numpy"
fi
# Built from a copy: setup.py writes the stubs next to its sources, and the checkout's own
# (editable) stubs come from the newer grpcio-tools of scripts/setup_python.sh.
cp -r "$repo/client/python" "$work/package"
rm -rf "$work/package/centroidkv/v1" "$work/package/build" "$work/package"/*.egg-info
# Without build isolation the stubs come from the pinned grpcio-tools; the package's
# requirements (setup.py) are checked against the pins, and pip must not have moved one.
CKV_PROTO_ROOT="$repo/proto" CKV_VERSION_FILE="$repo/VERSION" "${pip[@]}" install --no-build-isolation "$work/package"
"$work/venv/bin/python" - "$grpcio" "$protobuf" "$numpy" <<'EOF'
import sys
import google.protobuf, grpc, numpy
import centroidkv
have = (grpc.__version__, google.protobuf.__version__, numpy.__version__)
if have != tuple(sys.argv[1:]):
    sys.exit(f"check_oldest: installed {have}, asked for {tuple(sys.argv[1:])}")
from importlib.metadata import requires
needs = ", ".join(r for r in requires("centroidkv") if "extra" not in r)
print(f"check_oldest: {centroidkv.__file__} imports with grpcio {have[0]}, protobuf {have[1]}, "
      f"numpy {have[2]}; it requires {needs}")
EOF
# Without the extras torch is not installed: its tests skip (conftest.requires_torch) and the
# torch and transformers modules are left out. -rs lists every skip.
ignore=()
if [ -z "$torch" ]; then ignore+=(--ignore=tests/python/test_torch.py); fi
if [ -z "$transformers" ]; then ignore+=(--ignore=tests/python/test_transformers.py); fi
cd "$repo"
CKV_BIN_DIR="$bin_dir" CKV_SHARED_DIR="$shared_dir" nice -n 5 "$work/venv/bin/python" -m pytest \
  -q -rs -p no:cacheprovider tests/python "${ignore[@]}"
