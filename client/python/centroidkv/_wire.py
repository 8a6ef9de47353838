"""The wire encoding of centroidkv.v1.Compress: every byte this package puts on or takes off
the stream goes through here (one place to extend when the protocol grows).

StartJob / CancelJob requests and JobResult / JobError replies go through the generated
protobuf classes. TensorSlab messages, which carry the tensors, are encoded and decoded by
hand (they are four fields), so that a payload is copied exactly once on the way out (from
the caller's array into the message bytes gRPC sends) and once on the way in (from the
received message into the result array), with no intermediate `bytes` objects.
"""
from __future__ import annotations

from dataclasses import dataclass

from .v1 import centroidkv_pb2 as pb

METHOD_COMPRESS = "/centroidkv.v1.CentroidKV/Compress"
METHOD_GET_INFO = "/centroidkv.v1.CentroidKV/GetInfo"
METHOD_REGISTER_REGION = "/centroidkv.v1.CentroidKV/RegisterRegion"
METHOD_UNREGISTER_REGION = "/centroidkv.v1.CentroidKV/UnregisterRegion"

# Room left in a message for the slab's own fields and the CompressRequest wrapper.
SLAB_OVERHEAD_BYTES = 64

# Field tags (field number << 3 | wire type).
_TAG_REQUEST_SLAB = 0x12  # CompressRequest.slab = 2, length-delimited
_TAG_RESPONSE_SLAB = 0x12  # CompressResponse.slab = 2
_TAG_JOB_ID = 0x08
_TAG_TENSOR = 0x10
_TAG_OFFSET = 0x18
_TAG_DATA = 0x22

TENSOR_KEYS = pb.TENSOR_KEYS
TENSOR_VALUES = pb.TENSOR_VALUES
TENSOR_COUNTS = pb.TENSOR_COUNTS
TENSOR_OUT_KEYS = pb.TENSOR_OUT_KEYS
TENSOR_OUT_VALUES = pb.TENSOR_OUT_VALUES
TENSOR_OUT_COUNTS = pb.TENSOR_OUT_COUNTS
TENSOR_ASSIGNMENT = pb.TENSOR_ASSIGNMENT


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(buf, pos: int):
    result = 0
    shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def encode_slab(job_id: int, tensor: int, byte_offset: int, data: memoryview) -> bytes:
    """A serialized CompressRequest{slab: TensorSlab{...}}; `data` (1-D bytes view) is copied
    once, into the returned message."""
    inner = b"".join((bytes((_TAG_JOB_ID,)), _varint(job_id), bytes((_TAG_TENSOR,)),
                      _varint(tensor), bytes((_TAG_OFFSET,)), _varint(byte_offset),
                      bytes((_TAG_DATA,)), _varint(len(data))))
    return b"".join((bytes((_TAG_REQUEST_SLAB,)), _varint(len(inner) + len(data)), inner, data))


def encode_start_job(start: "pb.StartJob") -> bytes:
    return pb.CompressRequest(start_job=start).SerializeToString()


def encode_cancel(job_id: int) -> bytes:
    return pb.CompressRequest(cancel_job=pb.CancelJob(job_id=job_id)).SerializeToString()


@dataclass
class Slab:
    """A result slab as received: `data` is a view into the message, valid while it lives."""

    job_id: int
    tensor: int
    byte_offset: int
    data: memoryview


def decode_response(message: bytes):
    """Parses a serialized CompressResponse: a Slab for result slabs (without copying the
    payload), the protobuf CompressResponse for the rest (JobResult headers, JobError)."""
    view = memoryview(message)
    if len(view) > 0 and view[0] == _TAG_RESPONSE_SLAB:
        length, pos = _read_varint(view, 1)
        if pos + length == len(view):
            slab = _decode_slab(view, pos, pos + length)
            if slab is not None:
                return slab
    return pb.CompressResponse.FromString(message)


def _decode_slab(view: memoryview, pos: int, end: int):
    job_id = tensor = offset = 0
    data = view[0:0]
    while pos < end:
        tag, pos = _read_varint(view, pos)
        wire_type = tag & 7
        if wire_type == 0:
            value, pos = _read_varint(view, pos)
            field = tag >> 3
            if field == 1:
                job_id = value
            elif field == 2:
                tensor = value
            elif field == 3:
                offset = value
        elif wire_type == 2:
            length, pos = _read_varint(view, pos)
            if tag >> 3 == 4:
                data = view[pos:pos + length]
            pos += length
        else:
            return None  # not what this encoder knows: let protobuf parse it
    return Slab(job_id, tensor, offset, data) if pos == end else None
