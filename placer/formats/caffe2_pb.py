"""caffe2.proto message classes, wire-compatible with caffe2/proto/caffe2.proto.

Field names and numbers follow PROTO_FACTS.md. DeviceOption field 2 is named
``device_id`` (the current name); ``formats.caffe2`` also accepts the 2016-2018 name
``cuda_gpu_id`` in text files. ``device_type`` is an int32 (0 CPU, 1 CUDA), as upstream.
"""
from __future__ import annotations

from placer.formats.schema import build_file

_MESSAGES = {
    "TensorProto": [
        ("dims", 1, "int64", "repeated"),
        ("data_type", 2, "DataType", "optional", "FLOAT"),
        ("float_data", 3, "float", "repeated"),
        ("int32_data", 4, "int32", "repeated"),
        ("byte_data", 5, "bytes", "optional"),
        ("string_data", 6, "bytes", "repeated"),
        ("name", 7, "string", "optional"),
        ("device_detail", 8, "DeviceOption", "optional"),
        ("double_data", 9, "double", "repeated"),
        ("int64_data", 10, "int64", "repeated"),
        ("segment", 11, "Segment", "optional"),
        ("raw_data", 13, "bytes", "optional"),
        ("data_format", 15, "uint32", "optional", 0),
    ],
    "Segment": [
        ("begin", 1, "int64", "required"),
        ("end", 2, "int64", "required"),
    ],
    "QTensorProto": [
        ("dims", 1, "int64", "repeated"),
        ("precision", 2, "int32", "required"),
        ("scale", 3, "double", "required"),
        ("bias", 4, "double", "required"),
        ("is_signed", 5, "bool", "required"),
        ("data", 6, "int32", "repeated"),
        ("name", 7, "string", "optional"),
        ("data_type", 8, "DataType", "optional", "INT32"),
        ("scales", 9, "double", "repeated"),
        ("biases", 10, "double", "repeated"),
        ("axis", 11, "int32", "optional"),
        ("is_multiparam", 12, "bool", "optional", False),
    ],
    "TensorProtos": [("protos", 1, "TensorProto", "repeated")],
    "TensorShape": [
        ("dims", 1, "int64", "repeated"),
        ("data_type", 2, "DataType", "optional", "FLOAT"),
        ("unknown_dims", 3, "int32", "repeated"),
        ("unknown_shape", 4, "bool", "optional", False),
        ("name", 5, "string", "optional"),
    ],
    "Argument": [
        ("name", 1, "string", "optional"),
        ("f", 2, "float", "optional"),
        ("i", 3, "int64", "optional"),
        ("s", 4, "bytes", "optional"),
        ("floats", 5, "float", "repeated"),
        ("ints", 6, "int64", "repeated"),
        ("strings", 7, "bytes", "repeated"),
        ("n", 8, "NetDef", "optional"),
        ("nets", 9, "NetDef", "repeated"),
        ("t", 10, "TensorProto", "optional"),
        ("tensors", 11, "TensorProto", "repeated"),
        ("qtensors", 12, "QTensorProto", "repeated"),
    ],
    "DeviceOption": [
        ("device_type", 1, "int32", "optional", 0),
        ("device_id", 2, "int32", "optional", 0),
        ("random_seed", 3, "uint32", "optional"),
        ("node_name", 4, "string", "optional"),
        ("numa_node_id", 5, "int32", "optional", -1),
        ("extra_info", 6, "string", "repeated"),
    ],
    "OperatorDef": [
        ("input", 1, "string", "repeated"),
        ("output", 2, "string", "repeated"),
        ("name", 3, "string", "optional"),
        ("type", 4, "string", "optional"),
        ("arg", 5, "Argument", "repeated"),
        ("device_option", 6, "DeviceOption", "optional"),
        ("engine", 7, "string", "optional"),
        ("control_input", 8, "string", "repeated"),
        ("is_gradient_op", 9, "bool", "optional", False),
        ("debug_info", 10, "string", "optional"),
        ("domain", 11, "string", "optional"),
        ("op_version", 12, "int64", "optional"),
    ],
    "MapFieldEntry": [
        ("key", 1, "string", "required"),
        ("val", 2, "string", "required"),
    ],
    "BackendOptions": [
        ("backend_name", 1, "string", "required"),
        ("option", 2, "MapFieldEntry", "repeated"),
    ],
    "PartitionInfo": [
        ("name", 1, "string", "required"),
        ("device_id", 2, "int32", "repeated"),
        ("extra_info", 3, "string", "optional"),
        ("backend_options", 4, "BackendOptions", "repeated"),
    ],
    "NetDef": [
        ("name", 1, "string", "optional"),
        ("op", 2, "OperatorDef", "repeated"),
        ("type", 3, "string", "optional"),
        ("num_workers", 4, "int32", "optional"),
        ("device_option", 5, "DeviceOption", "optional"),
        ("arg", 6, "Argument", "repeated"),
        ("external_input", 7, "string", "repeated"),
        ("external_output", 8, "string", "repeated"),
        ("partition_info", 9, "PartitionInfo", "repeated"),
    ],
    "BlobProto": [
        ("name", 1, "string", "optional"),
        ("type", 2, "string", "optional"),
        ("tensor", 3, "TensorProto", "optional"),
        ("content", 4, "bytes", "optional"),
        ("qtensor", 5, "QTensorProto", "optional"),
        ("content_num_chunks", 6, "int32", "optional"),
        ("content_chunk_id", 7, "int32", "optional"),
    ],
}

_ENUMS = {
    "DataType": {
        "UNDEFINED": 0, "FLOAT": 1, "INT32": 2, "BYTE": 3, "STRING": 4, "BOOL": 5, "UINT8": 6,
        "INT8": 7, "UINT16": 8, "INT16": 9, "INT64": 10, "FLOAT16": 12, "DOUBLE": 13,
        "ZERO_COLLISION_HASH": 14, "REBATCHING_BUFFER": 15,
    },
    "DeviceTypeProto": {
        "PROTO_CPU": 0, "PROTO_CUDA": 1, "PROTO_MKLDNN": 2, "PROTO_OPENGL": 3, "PROTO_OPENCL": 4,
        "PROTO_IDEEP": 5, "PROTO_HIP": 6, "PROTO_FPGA": 7, "PROTO_MSNPU": 8, "PROTO_XLA": 9,
        "PROTO_MLC": 10, "PROTO_COMPILE_TIME_MAX_DEVICE_TYPES": 11,
    },
}

_PACKED = frozenset({("TensorProto", "float_data"), ("TensorProto", "int32_data"),
                     ("TensorProto", "double_data"), ("TensorProto", "int64_data"),
                     ("QTensorProto", "data")})

_CLASSES = build_file("placer/caffe2.proto", "caffe2", _MESSAGES, _ENUMS, _PACKED)

NetDef = _CLASSES["NetDef"]
OperatorDef = _CLASSES["OperatorDef"]
Argument = _CLASSES["Argument"]
DeviceOption = _CLASSES["DeviceOption"]
TensorProto = _CLASSES["TensorProto"]
TensorProtos = _CLASSES["TensorProtos"]
PartitionInfo = _CLASSES["PartitionInfo"]
BlobProto = _CLASSES["BlobProto"]

PROTO_CPU = 0
PROTO_CUDA = 1
