"""The key-value header of a GGUF file, read without decoding what is not asked for.

`gguf.GGUFReader` decodes every key, the tokenizer's arrays included: on a file with a real
vocabulary (150k tokens and merges) that took 44 s here, for three values. This walks the same
layout (the `gguf` package's magic and value types), skips every value it is not asked for by
its length, and decodes only the keys wanted; tests check that it agrees with GGUFReader.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from pathlib import Path

from gguf import GGUF_MAGIC, GGUFValueType

SUPPORTED_VERSIONS = (2, 3)
_SCALARS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


class HeaderError(Exception):
    """A file that is not a readable GGUF."""


class _Walker:
    def __init__(self, data: mmap.mmap, order: str) -> None:
        self.data = data
        self.order = order
        self.offset = 0

    def unpack(self, fmt: str) -> object:
        size = struct.calcsize(self.order + fmt)
        if self.offset + size > len(self.data):
            raise HeaderError("the file ends inside its header")
        (value,) = struct.unpack_from(self.order + fmt, self.data, self.offset)
        self.offset += size
        return value

    def integer(self, fmt: str) -> int:
        value = self.unpack(fmt)
        assert isinstance(value, int)
        return value

    def count(self) -> int:
        return self.integer("Q")

    def skip(self, size: int) -> None:
        if self.offset + size > len(self.data):
            raise HeaderError("the file ends inside its header")
        self.offset += size

    def string(self) -> str:
        size = self.count()
        start = self.offset
        self.skip(size)
        try:
            return self.data[start : self.offset].decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderError("a header string is not UTF-8") from None

    def value_type(self) -> GGUFValueType:
        raw = self.integer("I")
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise HeaderError(f"unknown header value type {raw}") from None

    def value(self, kind: GGUFValueType) -> object:
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            self.skip_value(kind)
            return None  # no wanted key is an array
        return self.unpack(_SCALARS[kind])

    def skip_strings(self, items: int) -> None:
        # A tokenizer's vocabulary and merges are some 300k strings: one tight loop over
        # their lengths, not a call per string.
        length = struct.Struct(self.order + "Q")
        data, end, offset = self.data, len(self.data), self.offset
        for _ in range(items):
            if offset + length.size > end:
                raise HeaderError("the file ends inside its header")
            offset += length.size + length.unpack_from(data, offset)[0]
        if offset > end:
            raise HeaderError("the file ends inside its header")
        self.offset = offset

    def skip_value(self, kind: GGUFValueType) -> None:
        if kind == GGUFValueType.STRING:
            self.skip(self.count())
        elif kind == GGUFValueType.ARRAY:
            item, items = self.value_type(), self.count()
            if item in _SCALARS:
                self.skip(items * struct.calcsize(self.order + _SCALARS[item]))
            elif item == GGUFValueType.STRING:
                self.skip_strings(items)
            else:
                for _ in range(items):
                    self.skip_value(item)
        else:
            self.skip(struct.calcsize(self.order + _SCALARS[kind]))


def _byte_order(data: mmap.mmap) -> str:
    if len(data) < 8 or struct.unpack_from("<I", data, 0)[0] != GGUF_MAGIC:
        raise HeaderError("not a GGUF file (no GGUF magic)")
    # A big-endian file's version reads as a multiple of 65536 in little-endian order.
    little = struct.unpack_from("<I", data, 4)[0]
    order = ">" if little & 0xFFFF == 0 else "<"
    version = struct.unpack_from(order + "I", data, 4)[0]
    if version not in SUPPORTED_VERSIONS:
        raise HeaderError(f"GGUF version {version} is not supported")
    return order


def _walk(walker: _Walker, wanted: Callable[[str], bool]) -> dict[str, object]:
    walker.offset = 8  # past the magic and the version
    walker.count()  # tensors: their descriptions follow the keys and are not read
    values: dict[str, object] = {}
    for _ in range(walker.count()):
        key = walker.string()
        kind = walker.value_type()
        if wanted(key):
            values[key] = walker.value(kind)
        else:
            walker.skip_value(kind)
    return values


def read_values(path: Path, wanted: Callable[[str], bool]) -> dict[str, object]:
    """The values of the header keys `wanted` accepts (arrays come back as None)."""
    try:
        with (
            path.open("rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
        ):
            return _walk(_Walker(data, _byte_order(data)), wanted)
    except (OSError, ValueError) as exc:  # mmap of an empty file is a ValueError
        raise HeaderError(f"cannot be read ({exc})") from None
