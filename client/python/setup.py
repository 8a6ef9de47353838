"""Build hook of the centroidkv package: generates the gRPC stubs from the repository's proto.

`centroidkv/v1/centroidkv_pb2.py` and `centroidkv_pb2_grpc.py` are written by grpcio-tools
from ../../proto/centroidkv/v1/centroidkv.proto (or $CKV_PROTO_ROOT/centroidkv/v1/...) every
time the package is built or installed, editable installs included. They are ignored by git.
"""
import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_FILE = "centroidkv/v1/centroidkv.proto"


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


class BuildPyWithStubs(build_py):
    def run(self):
        generate_stubs()
        super().run()


# Also now: metadata and editable installs list centroidkv.v1, which must exist first.
generate_stubs()
setup(cmdclass={"build_py": BuildPyWithStubs})
