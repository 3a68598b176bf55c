"""A small parser for the proto3 subset ``et_def.proto`` uses.

It turns schema text into a :class:`~google.protobuf.descriptor_pb2.FileDescriptorProto`
so the message classes can be built at import time by the installed protobuf
runtime, with no generated ``_pb2`` module (whose version stamp warns when the
runtime differs from the generator).

Supported: ``syntax = "proto3"``, ``package``, messages (nested), enums (nested),
``oneof``, ``repeated``, ``optional`` (proto3 presence), scalar, message and enum
field types, ``//`` and ``/* */`` comments.  Anything else (imports, options,
maps, reserved ranges, extensions) is rejected with the line it is on.
"""

from __future__ import annotations

import re

from google.protobuf import descriptor_pb2 as dpb

_F = dpb.FieldDescriptorProto

SCALARS = {
    "double": _F.TYPE_DOUBLE,
    "float": _F.TYPE_FLOAT,
    "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64,
    "uint32": _F.TYPE_UINT32,
    "uint64": _F.TYPE_UINT64,
    "sint32": _F.TYPE_SINT32,
    "sint64": _F.TYPE_SINT64,
    "fixed32": _F.TYPE_FIXED32,
    "fixed64": _F.TYPE_FIXED64,
    "sfixed32": _F.TYPE_SFIXED32,
    "sfixed64": _F.TYPE_SFIXED64,
    "bool": _F.TYPE_BOOL,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
}

_TOKEN = re.compile(
    r"""
    (?P<skip>\s+|//[^\n]*|/\*.*?\*/)
    | (?P<str>"(?:[^"\\\n]|\\.)*")
    | (?P<num>-?(?:0[xX][0-9a-fA-F]+|\d+))
    | (?P<ident>\.?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
    | (?P<sym>[{}=;\[\]<>(),])
    """,
    re.VERBOSE | re.DOTALL,
)


class ProtoSyntaxError(ValueError):
    """The schema text is outside the supported subset or malformed."""


def tokenize(text: str) -> list[tuple[str, str, int]]:
    """Split ``text`` into ``(kind, value, line)`` tokens, dropping comments."""
    tokens, pos, line = [], 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ProtoSyntaxError(f"line {line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind != "skip":
            tokens.append((kind, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    return tokens


def json_name(name: str) -> str:
    """protoc's default JSON name: drop underscores, upper-case the next letter."""
    out, upper = [], False
    for ch in name:
        if ch == "_":
            upper = True
        else:
            out.append(ch.upper() if upper else ch)
            upper = False
    return "".join(out)


class _Parser:
    def __init__(self, text: str):
        self.toks = tokenize(text)
        self.i = 0

    # ------------------------------------------------------------ token helpers
    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def line(self) -> int:
        tok = self.toks[min(self.i, len(self.toks) - 1)] if self.toks else None
        return tok[2] if tok else 1

    def fail(self, msg: str):
        raise ProtoSyntaxError(f"line {self.line()}: {msg}")

    def take(self, kind: str | None = None, value: str | None = None) -> str:
        if self.i >= len(self.toks):
            self.fail("unexpected end of file")
        k, v, _ = self.toks[self.i]
        if (kind and k != kind) or (value and v != value):
            self.fail(f"expected {value or kind}, got {v!r}")
        self.i += 1
        return v

    def number(self) -> int:
        return int(self.take("num"), 0)

    # ------------------------------------------------------------ grammar
    def file(self, name: str) -> dpb.FileDescriptorProto:
        fdp = dpb.FileDescriptorProto(name=name)
        self.take(value="syntax")
        self.take(value="=")
        syntax = self.take("str")[1:-1]
        if syntax != "proto3":
            self.fail(f"only proto3 is supported, got {syntax!r}")
        fdp.syntax = syntax
        self.take(value=";")
        while self.peek() is not None:
            word = self.take("ident")
            if word == "package":
                fdp.package = self.take("ident")
                self.take(value=";")
            elif word == "message":
                self.message(fdp.message_type.add())
            elif word == "enum":
                self.enum(fdp.enum_type.add())
            else:
                self.fail(f"unsupported statement {word!r}")
        return fdp

    def message(self, msg: dpb.DescriptorProto) -> None:
        msg.name = self.take("ident")
        self.take(value="{")
        optional_fields = []
        while self.peek() != "}":
            word = self.peek()
            if word == "message":
                self.take()
                self.message(msg.nested_type.add())
            elif word == "enum":
                self.take()
                self.enum(msg.enum_type.add())
            elif word == "oneof":
                self.take()
                index = len(msg.oneof_decl)
                msg.oneof_decl.add(name=self.take("ident"))
                self.take(value="{")
                while self.peek() != "}":
                    self.field(msg, oneof_index=index)
                self.take(value="}")
            elif word == ";":
                self.take()
            else:
                field = self.field(msg)
                if field.proto3_optional:
                    optional_fields.append(field)
        self.take(value="}")
        # proto3 `optional` gets a synthetic oneof, declared after the real ones
        taken = {o.name for o in msg.oneof_decl}
        for field in optional_fields:
            synthetic = "_" + field.name
            while synthetic in taken:
                synthetic = "_" + synthetic
            taken.add(synthetic)
            field.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=synthetic)

    def field(self, msg: dpb.DescriptorProto, oneof_index: int | None = None):
        label = _F.LABEL_OPTIONAL
        optional = False
        if self.peek() in ("repeated", "optional") and oneof_index is None:
            word = self.take()
            label = _F.LABEL_REPEATED if word == "repeated" else _F.LABEL_OPTIONAL
            optional = word == "optional"
        elif self.peek() in ("required", "map", "group", "reserved", "extensions", "option"):
            self.fail(f"{self.peek()!r} is not supported")
        type_name = self.take("ident")
        field = msg.field.add(name=self.take("ident"), label=label)
        self.take(value="=")
        field.number = self.number()
        if self.peek() == "[":
            self.fail("field options are not supported")
        self.take(value=";")
        field.json_name = json_name(field.name)
        if type_name in SCALARS:
            field.type = SCALARS[type_name]
        else:
            field.type_name = type_name  # resolved once every type is known
        if oneof_index is not None:
            field.oneof_index = oneof_index
        if optional:
            field.proto3_optional = True
        return field

    def enum(self, enum: dpb.EnumDescriptorProto) -> None:
        enum.name = self.take("ident")
        self.take(value="{")
        while self.peek() != "}":
            if self.peek() == ";":
                self.take()
                continue
            name = self.take("ident")
            self.take(value="=")
            enum.value.add(name=name, number=self.number())
            if self.peek() == "[":
                self.fail("enum value options are not supported")
            self.take(value=";")
        self.take(value="}")
        if not enum.value or enum.value[0].number != 0:
            self.fail(f"proto3 enum {enum.name} must start with a zero value")


# ---------------------------------------------------------------- type resolution


def _collect(prefix: str, messages, enums, out: dict[str, int]) -> None:
    for e in enums:
        out[f"{prefix}.{e.name}"] = _F.TYPE_ENUM
    for m in messages:
        full = f"{prefix}.{m.name}"
        out[full] = _F.TYPE_MESSAGE
        _collect(full, m.nested_type, m.enum_type, out)


def _resolve(scope: str, name: str, known: dict[str, int]) -> str:
    if name.startswith("."):
        if name in known:
            return name
        raise ProtoSyntaxError(f"unknown type {name!r}")
    parts = scope.split(".")
    while parts:  # innermost scope first, then outwards
        candidate = ".".join(parts + [name])
        if candidate in known:
            return candidate
        parts.pop()
    raise ProtoSyntaxError(f"unknown type {name!r} (in {scope.lstrip('.')})")


def _link(scope: str, messages, known: dict[str, int]) -> None:
    for m in messages:
        full = f"{scope}.{m.name}"
        for field in m.field:
            if field.type_name:
                field.type_name = _resolve(full, field.type_name, known)
                field.type = known[field.type_name]
        _link(full, m.nested_type, known)


def parse(text: str, name: str) -> dpb.FileDescriptorProto:
    """Parse proto3 ``text`` into a linked FileDescriptorProto called ``name``."""
    fdp = _Parser(text).file(name)
    root = "." + fdp.package if fdp.package else ""
    known: dict[str, int] = {}
    _collect(root, fdp.message_type, fdp.enum_type, known)
    _link(root, fdp.message_type, known)
    return fdp
