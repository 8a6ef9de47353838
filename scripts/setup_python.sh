#!/usr/bin/env bash
# The Python client's virtual environment (.venv in the checkout): the `centroidkv` package
# of client/python installed editable (its gRPC stubs generated from this checkout's proto)
# over a per-machine environment that holds the PyPI dependencies (grpcio, grpcio-tools,
# protobuf, numpy, pytest, torch, transformers, kvpress; client/python/requirements-dev.txt).
# torch is large, so that one lives once per machine, outside any checkout
# (CKV_PYTHON_DEPS, default ~/.cache/centroidkv/py311-deps), and a fresh clone (CI) reuses
# it; .venv sees it through a .pth file. Safe to run twice: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

deps=${CKV_PYTHON_DEPS:-$HOME/.cache/centroidkv/py311-deps}
requirements=client/python/requirements-dev.txt

if [ ! -x "$deps/bin/python" ]; then
  echo "setup_python: creating $deps"
  mkdir -p "$(dirname "$deps")"
  /usr/bin/python3 -m venv "$deps"
fi
# The stamp records what was installed; pip runs again only when the requirements change.
stamp="$deps/.ckv-requirements"
if ! cmp -s "$requirements" "$stamp"; then
  echo "setup_python: installing client/python/requirements-dev.txt from PyPI into $deps"
  "$deps/bin/python" -m pip install -q -r "$requirements"
  cp "$requirements" "$stamp"
fi

# .venv has no pip or setuptools of its own (Debian's would shadow the newer ones of the
# dependencies): the dependencies' pip installs into it.
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --without-pip .venv
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
deps_site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps_site" > "$site/centroidkv-deps.pth"
# The package, editable: writes client/python/centroidkv/v1/ (the stubs) from the proto.
"$deps/bin/python" -m pip --python .venv/bin/python install -q --no-deps --no-build-isolation \
  -e client/python
echo "setup_python: .venv ready ($(.venv/bin/python -c 'import importlib.metadata, centroidkv, grpc, torch, transformers, kvpress; print("centroidkv", centroidkv.__version__, "grpcio", grpc.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "kvpress", importlib.metadata.version("kvpress"))'))"
