"""Build hook of the centroidkv package: generates the gRPC stubs from the repository's proto.

`centroidkv/v1/centroidkv_pb2.py` and `centroidkv_pb2_grpc.py` are written by grpcio-tools
from ../../proto/centroidkv/v1/centroidkv.proto (or $CKV_PROTO_ROOT/centroidkv/v1/...) every
time the package is built or installed, editable installs included. They are ignored by git.

Generated stubs run only on a runtime at least as new as their generator (the _pb2 module
checks protobuf >= its gencode version, the _pb2_grpc module grpcio >= the grpcio-tools that
wrote it), so the package's grpcio and protobuf requirements are the newer of the oldest
versions verified to work and what this build's grpcio-tools generated.

The version is the repository's VERSION (../../VERSION, or $CKV_VERSION_FILE), the one place it
is written.
"""
import os
import pathlib
import re

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_FILE = "centroidkv/v1/centroidkv.proto"
# The oldest versions verified to work (client/python/check_oldest.sh; docs/python-client.md):
# the oldest grpcio and numpy with Python 3.11 wheels, and the oldest protobuf that installs
# with grpcio-tools 1.49.1 (the stubs' generator in such an environment).
OLDEST = {"grpcio": "1.49.1", "protobuf": "4.21.3", "numpy": "1.23.2"}


def generate_stubs():
    proto_root = pathlib.Path(os.environ.get("CKV_PROTO_ROOT", HERE.parent.parent / "proto"))
    source = proto_root / PROTO_FILE
    if not source.is_file():
        raise RuntimeError(f"centroidkv: {source} not found (set CKV_PROTO_ROOT to the folder "
                           "holding centroidkv/v1/centroidkv.proto)")
    import grpc_tools
    from grpc_tools import protoc

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    out = HERE / "centroidkv" / "v1"
    out.mkdir(exist_ok=True)
    rc = protoc.main(["grpc_tools.protoc", f"-I{proto_root}", f"-I{include}",
                      f"--python_out={HERE}", f"--grpc_python_out={HERE}", str(source)])
    if rc != 0:
        raise RuntimeError(f"centroidkv: grpc_tools.protoc failed on {source} (exit {rc})")
    (out / "__init__.py").write_text('"""Generated from proto/centroidkv/v1/centroidkv.proto."""\n')
    return out / "centroidkv_pb2.py"


def project_version() -> str:
    path = pathlib.Path(os.environ.get("CKV_VERSION_FILE", HERE.parent.parent / "VERSION"))
    if not path.is_file():
        raise RuntimeError(f"centroidkv: {path} not found (set CKV_VERSION_FILE to the "
                           "repository's VERSION)")
    return path.read_text().strip()


def _release(version: str) -> tuple:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def runtime_requirements(pb2: pathlib.Path) -> list:
    """What the stubs in `pb2`'s folder need at run time, with the verified oldest versions."""
    from importlib.metadata import version

    generated = {"grpcio": version("grpcio-tools")}
    gencode = re.search(r"^# Protobuf Python Version: (\S+)$", pb2.read_text(), re.MULTILINE)
    if gencode is not None:
        generated["protobuf"] = gencode.group(1)
    floors = {name: max(oldest, generated.get(name, oldest), key=_release)
              for name, oldest in OLDEST.items()}
    return [f"{name}>={floor}" for name, floor in floors.items()]


class BuildPyWithStubs(build_py):
    def run(self):
        generate_stubs()
        super().run()


# Also now: metadata and editable installs list centroidkv.v1, which must exist first, and the
# requirements depend on what generated it.
setup(cmdclass={"build_py": BuildPyWithStubs}, version=project_version(),
      install_requires=runtime_requirements(generate_stubs()))
