"""Chakra ET message classes, built at import time from ``et_def.proto``.

The schema is parsed by :mod:`.protoparse`, added to a private descriptor pool
(so it never clashes with another copy of ``et_def.proto`` in protobuf's default
pool, e.g. the chakra package's) and turned into classes by the installed
protobuf runtime.  Works on protobuf 4.21 and newer without warnings.
"""

from __future__ import annotations

from stage_core import __version__ as stage_version

from importlib import resources

from google.protobuf import descriptor_pool, message_factory

from . import protoparse

PACKAGE = "ChakraProtoMsg"
#: the ``version`` STAGE writes into every trace's GlobalMetadata
ET_VERSION = "0.0.4"
#: the GlobalMetadata attribute naming the program that wrote a trace: STAGE writes
#: ``"stage <version>"`` (the reader gives it as TraceSet.metadata["generator"], so a set
#: STAGE wrote is known as one with its manifest.json gone)
GENERATOR_ATTR = "generator"
GENERATOR = f"stage {stage_version}"


def _serialized_schema() -> bytes:
    text = resources.files(__package__).joinpath("et_def.proto").read_text("utf-8")
    return protoparse.parse(text, "stage_adapter_chakra/et_def.proto").SerializeToString()


def _message_class(descriptor):
    get_class = getattr(message_factory, "GetMessageClass", None)
    if get_class is not None:  # protobuf >= 4.22
        return get_class(descriptor)
    return message_factory.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)


def _all_classes(descriptors) -> dict:
    out = {}
    for desc in descriptors:
        out[desc.full_name] = _message_class(desc)
        out.update(_all_classes(desc.nested_types))
    return out


SERIALIZED_SCHEMA = _serialized_schema()
POOL = descriptor_pool.DescriptorPool()
_FILE = POOL.AddSerializedFile(SERIALIZED_SCHEMA) or POOL.FindFileByName(
    "stage_adapter_chakra/et_def.proto")
# Every class is made now and kept: protobuf 4.22-4.24 (upb) can crash on the first
# access to a sub-message field whose class was never made (protocolbuffers/protobuf
# issue 12047), and the serialized schema is kept alive as generated code keeps its own.
CLASSES = _all_classes(_FILE.message_types_by_name.values())


def message(name: str):
    """The message class ``ChakraProtoMsg.<name>``."""
    return CLASSES[f"{PACKAGE}.{name}"]


def enum_names(name: str) -> dict[int, str]:
    """Number -> name of the values of enum ``ChakraProtoMsg.<name>``."""
    enum = POOL.FindEnumTypeByName(f"{PACKAGE}.{name}")
    return {v.number: v.name for v in enum.values}


GlobalMetadata = message("GlobalMetadata")
Node = message("Node")
AttributeProto = message("AttributeProto")

NODE_TYPE_NAMES = enum_names("NodeType")
COMM_TYPE_NAMES = enum_names("CollectiveCommType")
