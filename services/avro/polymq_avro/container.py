"""Avro object container files, read and written (sans-IO: bytes in, records out).

::

    file   = "Obj" 0x01, metadata (an Avro map of bytes), sync (16 bytes), block*
    block  = count (long), size (long), data (size bytes, compressed by the codec), sync

Reading is done here rather than by fastavro's file reader for three reasons: each record's
exact bytes are wanted (a message body is the record as written, never decoded and encoded
again), every limit must hold *before* memory is spent (decompressed bytes are bounded as
they are inflated, so a small body cannot expand into gigabytes), and a damaged file must
be refused whole, with the place of the damage, before anything is published. The records
themselves are checked against the writer's schema by ``split_records``: a block is walked
by the schema's compiled :mod:`.scanner` (fast, and stricter than fastavro), and a block the
scanner does not take is decoded record by record by fastavro, which has the last word.

Codecs: ``null``, ``deflate``, ``snappy`` (cramjam, CRC checked), ``zstandard`` (cramjam,
inflated into a bounded buffer: ``_inflate_zstd``), ``bzip2`` and ``xz``: every codec fastavro
reads but ``lz4``.

Errors (all :class:`polymq_server.messages.avro.AvroError`, so they answer as problem details)::

    CorruptContainer   422 corrupt-container   not a container, or a damaged one
     └── Truncated     422 truncated           the body ends inside the file
    UnsupportedCodec   422 unsupported-codec
    TooLarge           413 too-large           records or decompressed bytes over a limit
    polymq_server.messages.avro.DecodeError  422 invalid-record  a record that does not match the
    schema
"""

from __future__ import annotations

import bz2
import io
import lzma
import os
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import cramjam
from fastavro import schemaless_reader

from polymq_server.messages.avro import AvroError, AvroSchema, DecodeError
from polymq_server.messages.avrobounds import walk

from .scanner import scanner

__all__ = [
    "CODECS",
    "MAGIC",
    "Container",
    "CorruptContainer",
    "TooLarge",
    "Truncated",
    "UnsupportedCodec",
    "read_container",
    "split_records",
    "write_container",
]

MAGIC = b"Obj\x01"
SYNC_SIZE = 16
CODECS = ("null", "deflate", "snappy", "zstandard", "bzip2", "xz")
WRITE_CODECS = ("null", "deflate", "snappy")


class CorruptContainer(AvroError):
    code = "corrupt-container"
    status = 422


class Truncated(CorruptContainer):
    code = "truncated"
    status = 422


class UnsupportedCodec(AvroError):
    code = "unsupported-codec"
    status = 422


class TooLarge(AvroError):
    code = "too-large"
    status = 413


@dataclass(frozen=True, eq=False)
class Container:
    """A container's header and its blocks, decompressed: ``(record count, data)``."""

    schema_json: str
    codec: str
    metadata: dict[str, bytes]
    blocks: list[tuple[int, bytes]] = field(repr=False)

    @property
    def count(self) -> int:
        return sum(n for n, _ in self.blocks)


# ---- primitives ------------------------------------------------------------------------
def _read_long(data: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(data):
            raise Truncated(f"the body ends inside a number at byte {pos}")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptContainer(f"a number longer than 10 bytes at byte {pos}")


def _read_bytes(data: bytes, pos: int, what: str) -> tuple[bytes, int]:
    n, pos = _read_long(data, pos)
    if n < 0:
        raise CorruptContainer(f"negative length of {what} at byte {pos}")
    if pos + n > len(data):
        raise Truncated(f"the body ends inside {what} ({n} bytes from byte {pos})")
    return data[pos : pos + n], pos + n


def _long(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# ---- reading -----------------------------------------------------------------------------
def read_container(data: bytes, *, max_records: int, max_decoded: int) -> Container:
    """Parse a whole container: its header, and each block checked (sync marker) and
    decompressed. TooLarge as soon as the records or their bytes pass a limit."""
    if data[:4] != MAGIC:
        raise CorruptContainer("not an Avro object container (no 'Obj' 0x01 magic)")
    metadata, pos = _read_metadata(data, 4)
    if pos + SYNC_SIZE > len(data):
        raise Truncated("the body ends inside the container's header")
    sync = data[pos : pos + SYNC_SIZE]
    pos += SYNC_SIZE
    raw_schema = metadata.get("avro.schema")
    if raw_schema is None:
        raise CorruptContainer("the container's metadata has no avro.schema")
    try:
        schema_json = raw_schema.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptContainer("the container's avro.schema is not UTF-8") from None
    codec = metadata.get("avro.codec", b"null").decode("utf-8", "replace") or "null"
    if codec not in CODECS:
        raise UnsupportedCodec(f"codec {codec[:40]!r} is not supported (use {', '.join(CODECS)})")
    blocks: list[tuple[int, bytes]] = []
    records = decoded = 0
    while pos < len(data):
        start = pos
        count, pos = _read_long(data, pos)
        if count < 0:
            raise CorruptContainer(f"negative record count in the block at byte {start}")
        raw, pos = _read_bytes(data, pos, f"the block at byte {start}")
        if pos + SYNC_SIZE > len(data):
            raise Truncated(f"the body ends before the sync marker of the block at byte {start}")
        if data[pos : pos + SYNC_SIZE] != sync:
            raise CorruptContainer(f"wrong sync marker after the block at byte {start}")
        pos += SYNC_SIZE
        records += count
        if records > max_records:
            raise TooLarge(f"more than {max_records} records in one request; send fewer")
        block = _decompress(codec, raw, max_decoded - decoded, start)
        decoded += len(block)
        if count == 0 and block:
            raise CorruptContainer(f"the block at byte {start} holds bytes but no records")
        blocks.append((count, block))
    return Container(schema_json, codec, metadata, blocks)


def _read_metadata(data: bytes, pos: int) -> tuple[dict[str, bytes], int]:
    out: dict[str, bytes] = {}
    while True:
        count, pos = _read_long(data, pos)
        if count == 0:
            return out, pos
        if count < 0:  # a block of -count entries, preceded by its size in bytes
            count = -count
            _, pos = _read_long(data, pos)
        for _ in range(count):
            key, pos = _read_bytes(data, pos, "a metadata key")
            value, pos = _read_bytes(data, pos, "a metadata value")
            try:
                out[key.decode("utf-8")] = value
            except UnicodeDecodeError:
                raise CorruptContainer("a metadata key of the container is not UTF-8") from None
            if len(out) > 10_000:
                raise CorruptContainer("more than 10000 metadata entries")


_TOO_LARGE = (
    "the records of this request take more bytes, decompressed, than one request may carry "
    "({budget} more were allowed); send fewer records per request"
)


def _decompress(codec: str, raw: bytes, budget: int, at: int) -> bytes:
    """The block's data, decompressed; TooLarge past ``budget`` bytes."""
    if codec == "null":
        out = raw
    else:
        try:
            out = _inflate(codec, raw, budget)
        except AvroError:
            raise
        except Exception as exc:
            detail = str(exc).strip() or type(exc).__name__
            raise CorruptContainer(
                f"the {codec} data of the block at byte {at} does not decompress: {detail[:200]}"
            ) from None
    if len(out) > budget:
        raise TooLarge(_TOO_LARGE.format(budget=max(budget, 0)))
    return out


def _inflate(codec: str, raw: bytes, budget: int) -> bytes:
    """Inflate at most ``budget`` + 1 bytes (one more than allowed tells that it is over)."""
    limit = max(budget, 0) + 1
    if codec == "deflate":
        d = zlib.decompressobj(-15)
        out = d.decompress(raw, limit)
        if len(out) < limit and not d.eof:
            raise CorruptContainer("the deflate data ends early")
        return out
    if codec == "snappy":
        if len(raw) < 4:
            raise CorruptContainer("a snappy block shorter than its checksum")
        body, crc = raw[:-4], raw[-4:]
        if int(cramjam.snappy.decompress_raw_len(body)) >= limit:
            raise TooLarge(_TOO_LARGE.format(budget=max(budget, 0)))
        out = bytes(cramjam.snappy.decompress_raw(body))
        if zlib.crc32(out) != int.from_bytes(crc, "big"):
            raise CorruptContainer("a snappy block's CRC-32 does not match its data")
        return out
    if codec == "bzip2":
        b = bz2.BZ2Decompressor()
        out = b.decompress(raw, limit)
        if len(out) < limit and not b.eof:
            raise CorruptContainer("the bzip2 data ends early")
        return out
    if codec == "xz":
        x = lzma.LZMADecompressor()
        out = x.decompress(raw, limit)
        if len(out) < limit and not x.eof:
            raise CorruptContainer("the xz data ends early")
        return out
    return _inflate_zstd(raw, budget, limit)


_ZSTD_FIRST_BUFFER = 64 * 1024  # bytes: the least a zstandard block is first inflated into
# what cramjam says when the buffer it inflates into is full (Rust's io::ErrorKind::WriteZero)
_ZSTD_FULL = "failed to write whole buffer"


def _inflate_zstd(raw: bytes, budget: int, limit: int) -> bytes:
    """A zstandard block inflated into at most ``limit`` bytes of memory.

    cramjam's ``zstd.decompress`` (and its ``Decompressor``) inflate whole frames, with
    no bound; ``zstd.decompress_into`` streams into a buffer of fixed size and stops when
    it is full. The buffer starts at 16 times the block's size (64 KiB at least) and
    doubles while it fills, up to ``limit``: it grows past its first size to twice the
    block's inflated size at most, the work to three inflations of it at most, and a block
    that fills ``limit`` is TooLarge without a byte more. A full buffer is told from damaged
    data by cramjam's message."""
    size = min(limit, max(_ZSTD_FIRST_BUFFER, 16 * len(raw)))
    while True:
        buf = bytearray(size)
        try:
            n = cramjam.zstd.decompress_into(raw, buf)
        except cramjam.DecompressionError as exc:
            if _ZSTD_FULL not in str(exc):
                raise
            if size >= limit:
                raise TooLarge(_TOO_LARGE.format(budget=max(budget, 0))) from None
            del buf  # (before the next is made)
            size = min(limit, 2 * size)
            continue
        return bytes(memoryview(buf)[:n])


def split_records(container: Container, schema: AvroSchema) -> list[bytes]:
    """Every record's bytes, in order, each checked by decoding it with ``schema`` (the
    writer's); DecodeError names the first record that is not valid, and a block whose
    records do not fill it exactly is corrupt.

    A block is first walked by the schema's :mod:`scanner`; one it does not vouch for
    (damaged, or merely unusual) is decoded record by record with fastavro, which decides.
    Before either, the records of a schema that could nest without bound (a recursive one)
    are walked with a depth bound (``polymq_server.messages.avrobounds.walk``): neither the
    scanner's generated functions (Python recursion) nor fastavro's C reader (C recursion,
    unprotected) ever sees a record nested too deeply."""
    out: list[bytes] = []
    scan = scanner(schema.canonical, schema.plain)
    for b, (count, block) in enumerate(container.blocks):
        if schema.shape.walk:
            _check_block(b, count, block, schema, len(out))
        ends: list[int] | None = None
        if scan is not None:
            try:
                ends = scan(block, count)
            except Exception:  # fastavro looks at this block below, and decides
                pass
        if ends is not None and (ends[-1] if ends else 0) == len(block):
            pos = 0
            for end in ends:
                out.append(block[pos:end])
                pos = end
            continue
        _split_block(out, b, count, block, schema)
    return out


def _check_block(b: int, count: int, block: bytes, schema: AvroSchema, first: int) -> None:
    """DecodeError for the first record of block ``b`` that breaks a bound."""
    pos = 0
    for i in range(count):
        try:
            pos = walk(block, pos, schema.plain, schema.shape.named)
        except Exception as exc:
            raise _invalid(first + i, b, schema, exc) from None


def _invalid(record: int, b: int, schema: AvroSchema, exc: Exception) -> DecodeError:
    detail = str(exc).strip() or type(exc).__name__
    return DecodeError(
        f"record {record} (block {b}) is not valid for schema {schema.id}: {detail[:200]}"
    )


def _split_block(out: list[bytes], b: int, count: int, block: bytes, schema: AvroSchema) -> None:
    """The records of block ``b``, each decoded by fastavro, appended to ``out``."""
    plain = schema.plain
    stream = io.BytesIO(block)
    pos = 0
    for _ in range(count):
        try:
            schemaless_reader(stream, plain, None)
        except Exception as exc:
            raise _invalid(len(out), b, schema, exc) from None
        end = stream.tell()
        if end > len(block):
            raise DecodeError(f"record {len(out)} (block {b}) runs past its block")
        out.append(block[pos:end])
        pos = end
    if pos != len(block):
        raise CorruptContainer(
            f"block {b} holds {len(block) - pos} byte(s) after its {count} record(s)"
        )


# ---- writing -----------------------------------------------------------------------------
def write_container(
    schema_json: str,
    records: Iterable[bytes],
    *,
    codec: str = "null",
    metadata: Mapping[str, str | bytes] | None = None,
    sync: bytes | None = None,
) -> bytes:
    """A container of ``records`` (each a datum's binary encoding) in one block."""
    if codec not in WRITE_CODECS:
        raise UnsupportedCodec(f"cannot write codec {codec!r} (use {', '.join(WRITE_CODECS)})")
    sync = os.urandom(SYNC_SIZE) if sync is None else sync
    meta: dict[str, bytes] = {"avro.schema": schema_json.encode(), "avro.codec": codec.encode()}
    for k, v in (metadata or {}).items():
        meta[k] = v.encode() if isinstance(v, str) else bytes(v)
    out = io.BytesIO()
    out.write(MAGIC)
    out.write(_long(len(meta)))
    for k, v in meta.items():
        kb = k.encode()
        out.write(_long(len(kb)) + kb + _long(len(v)) + v)
    out.write(_long(0))
    out.write(sync)
    items = list(records)
    if items:
        data = b"".join(items)
        if codec == "deflate":
            data = zlib.compress(data)[2:-4]  # raw deflate: no zlib header or checksum
        elif codec == "snappy":
            crc = zlib.crc32(data).to_bytes(4, "big")
            data = bytes(cramjam.snappy.compress_raw(data)) + crc
        out.write(_long(len(items)) + _long(len(data)))
        out.write(data)
        out.write(sync)
    return out.getvalue()
