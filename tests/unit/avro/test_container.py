"""Object container files (``polymq_avro.container``): read what fastavro writes with every
codec, write what fastavro reads, refuse damage and bombs before any memory is spent."""

from __future__ import annotations

import io
import tracemalloc
import zlib
from typing import Any

import cramjam
import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polymq_avro.container import (
    CorruptContainer,
    TooLarge,
    Truncated,
    UnsupportedCodec,
    _read_long,
    _read_metadata,
    read_container,
    split_records,
    write_container,
)
from polymq_server.messages.avro import AvroError, DecodeError, decode_single, parse

SCHEMA = {
    "type": "record",
    "name": "Row",
    "fields": [
        {"name": "i", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": ["null", "double"], "default": None},
    ],
}
LIMITS = {"max_records": 100_000, "max_decoded": 64 * 1024 * 1024}


def rows(n: int) -> list[dict[str, Any]]:
    return [{"i": i, "name": f"row-{i}", "score": i / 2 if i % 3 else None} for i in range(n)]


def container(records: list[dict[str, Any]], codec: str = "null", **kw: Any) -> bytes:
    out = io.BytesIO()
    fastavro.writer(out, SCHEMA, records, codec=codec, **kw)
    return out.getvalue()


def decoded(data: bytes, **limits: int) -> list[Any]:
    c = read_container(data, **{**LIMITS, **limits})
    schema = parse(c.schema_json)
    return [decode_single(schema.header + r, schema) for r in split_records(c, schema)]


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy", "bzip2", "xz"])
def test_reads_what_fastavro_writes(codec: str) -> None:
    records = rows(500)
    data = container(records, codec, sync_interval=1000)  # several blocks
    c = read_container(data, **LIMITS)
    assert c.codec == codec and len(c.blocks) > 1 and c.count == 500
    assert decoded(data) == records


def test_record_bytes_are_the_written_bytes() -> None:
    """A message body is the record as the producer wrote it, not decoded and re-encoded."""
    records = rows(20)
    c = read_container(container(records), **LIMITS)
    schema = parse(c.schema_json)
    for raw, rec in zip(split_records(c, schema), records, strict=True):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schema.parsed, rec)
        assert raw == out.getvalue()


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy"])
def test_fastavro_reads_what_we_write(codec: str) -> None:
    records = rows(300)
    schema = parse(SCHEMA)
    raw = split_records(read_container(container(records), **LIMITS), schema)
    data = write_container(schema.json, raw, codec=codec, metadata={"polymq.next": "301"})
    reader = fastavro.reader(io.BytesIO(data))
    assert list(reader) == records
    assert reader.metadata["polymq.next"] == "301" and reader.codec == codec
    assert decoded(data) == records  # and we read it back


def test_an_empty_container_has_no_records() -> None:
    data = container([])
    assert read_container(data, **LIMITS).count == 0
    assert list(fastavro.reader(io.BytesIO(write_container(parse(SCHEMA).json, [])))) == []


def test_a_container_truncated_inside_a_block_or_header_is_refused() -> None:
    data = container(rows(50), "deflate", sync_interval=300)
    boundaries = _block_ends(data)
    for cut in range(1, len(data)):
        if cut in boundaries:
            continue  # a file cut right after a block is a valid, shorter file
        with pytest.raises(AvroError):
            decoded(data[:cut])


@settings(max_examples=300)
@given(st.data())
def test_damage_is_refused_or_harmless(data: st.DataObject) -> None:
    """Flipping a byte anywhere never crashes the reader with anything but an AvroError;
    when the result still parses, every record in it decodes (nothing half-valid)."""
    body = bytearray(container(rows(30), data.draw(st.sampled_from(["null", "deflate"]))))
    at = data.draw(st.integers(0, len(body) - 1))
    body[at] ^= data.draw(st.integers(1, 255))
    try:
        out = decoded(bytes(body))
    except AvroError:
        return
    assert isinstance(out, list)


def test_wrong_sync_marker_is_corrupt() -> None:
    data = bytearray(container(rows(10)))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptContainer, match="sync marker"):
        read_container(bytes(data), **LIMITS)


def test_garbage_block_data_is_an_invalid_record() -> None:
    """A block whose bytes are not records of the schema (a string running past the end,
    invalid UTF-8) is refused as an invalid record."""
    schema = parse(SCHEMA)
    good = split_records(read_container(container(rows(3)), **LIMITS), schema)
    bad = [good[0], b"\x04\x7f\xff\xfe", good[2]]  # i=2, name of 63 bytes: not there
    with pytest.raises(DecodeError, match="record 1"):
        decoded(write_container(schema.json, bad))
    utf8 = [b"\x04\x04\xff\xfe\x00"]  # a 2-byte name that is not UTF-8
    with pytest.raises(DecodeError):
        decoded(write_container(schema.json, utf8))


def test_a_block_with_bytes_after_its_records_is_corrupt() -> None:
    schema = parse(SCHEMA)
    good = split_records(read_container(container(rows(2)), **LIMITS), schema)
    data = write_container(schema.json, [good[0], good[1] + b"\x00"])
    c = read_container(data, **LIMITS)
    with pytest.raises(CorruptContainer, match="after its 2 record"):
        split_records(c, schema)


def test_not_a_container() -> None:
    with pytest.raises(CorruptContainer, match="magic"):
        read_container(b"PAR1....", **LIMITS)
    with pytest.raises(Truncated):
        read_container(b"Obj\x01", **LIMITS)


def test_a_container_without_a_schema_is_corrupt() -> None:
    data = write_container("{}", [])
    data = data.replace(b"avro.schema", b"avro.schemX")
    with pytest.raises(CorruptContainer, match=r"avro\.schema"):
        read_container(data, **LIMITS)


def test_unknown_codec() -> None:
    data = container(rows(3)).replace(b"\x08null", b"\x08lzzz")
    with pytest.raises(UnsupportedCodec):
        read_container(data, **LIMITS)


@pytest.mark.parametrize("codec", ["deflate", "snappy", "bzip2", "xz"])
def test_a_decompression_bomb_is_stopped_at_the_limit(codec: str) -> None:
    """Eight MiB of one repeated record compress to little; the limit stops inflating."""
    big = [{"i": 0, "name": "x" * 8192, "score": None}] * 1024
    data = container(big, codec, sync_interval=64 * 1024 * 1024)
    assert len(data) < 512 * 1024
    with pytest.raises(TooLarge) as info:
        read_container(data, max_records=100_000, max_decoded=1024 * 1024)
    assert info.value.status == 413


def test_reads_zstandard_blocks() -> None:
    """Blocks of every size, among them one that inflates past the first buffer
    (``_inflate_zstd`` starts at 16 times the block's size and doubles)."""
    small, big = rows(300), [{"i": i, "name": "x" * 8192, "score": None} for i in range(64)]
    data = zstd_container(zstd_block(small[:100]), zstd_block(big), zstd_block(small[100:]))
    c = read_container(data, **LIMITS)
    assert c.codec == "zstandard" and len(c.blocks) == 3 and c.count == 364
    assert len(c.blocks[1][1]) > max(64 * 1024, 16 * len(zstd_block(big)[1]))
    assert decoded(data) == small[:100] + big + small[100:]


def test_a_zstandard_bomb_is_refused_within_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 MiB of one repeated record in a block of a few KiB, read with a 1 MiB limit:
    refused 413 by the limit, and zstandard never inflates into more than the limit + 1
    bytes (cramjam's own memory does not grow with the data either: it streams into the
    buffer), so the reader's peak stays near the limit rather than the data's size."""
    limit = 1024 * 1024
    data = zstd_container(zstd_block([{"i": 0, "name": "x" * 8192, "score": None}] * 2048))
    assert len(data) < 64 * 1024
    buffers: list[int] = []
    inflate = cramjam.zstd.decompress_into

    def spy(raw: bytes, output: bytearray) -> int:
        buffers.append(len(output))
        return inflate(raw, output)

    monkeypatch.setattr(cramjam.zstd, "decompress_into", spy)
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge, match="more bytes, decompressed") as info:
            read_container(data, max_records=100_000, max_decoded=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.status == 413
    assert buffers and max(buffers) == limit + 1
    assert peak < 2 * limit


def test_damaged_zstandard_is_corrupt() -> None:
    count, block = zstd_block(rows(50))
    for damaged in (block[: len(block) // 2], b"\x00" * len(block), b""):
        with pytest.raises(CorruptContainer, match=r"zstandard data .* does not decompress"):
            read_container(zstd_container((count, damaged)), **LIMITS)


def test_too_many_records() -> None:
    with pytest.raises(TooLarge, match="more than 10 records"):
        read_container(container(rows(11)), max_records=10, max_decoded=10**6)
    assert read_container(container(rows(10)), max_records=10, max_decoded=10**6).count == 10


def test_snappy_checksum_is_checked() -> None:
    data = bytearray(container(rows(5), "snappy"))
    c = read_container(bytes(data), **LIMITS)
    block_len = len(c.blocks[0][1])
    assert block_len > 0
    crc_at = len(data) - 16 - 4  # the CRC is the last 4 bytes of the block's data
    data[crc_at] ^= 0x01
    with pytest.raises(CorruptContainer, match="CRC"):
        read_container(bytes(data), **LIMITS)


def test_deflate_that_ends_early_is_corrupt() -> None:
    schema = parse(SCHEMA)
    payload = b"".join(split_records(read_container(container(rows(50)), **LIMITS), schema))
    stream = zlib.compress(payload)[2:-4]
    short = stream[: len(stream) // 2]
    header = write_container(schema.json, [], codec="deflate")
    sync = header[-16:]
    block = _long(50) + _long(len(short)) + short + sync
    with pytest.raises(CorruptContainer):
        read_container(header + block, **LIMITS)


# ---- helpers ----------------------------------------------------------------------------------
def zstd_block(records: list[dict[str, Any]]) -> tuple[int, bytes]:
    """``records``' count and their bytes compressed by zstandard."""
    out = io.BytesIO()
    for r in records:
        fastavro.schemaless_writer(out, parse(SCHEMA).parsed, r)
    return len(records), bytes(cramjam.zstd.compress(out.getvalue()))


def zstd_container(*blocks: tuple[int, bytes]) -> bytes:
    """A container of zstandard ``blocks`` (fastavro writes zstandard only with the
    ``zstandard`` package, which polymq does without)."""
    header = write_container(parse(SCHEMA).json, []).replace(b"\x08null", b"\x12zstandard")
    sync = header[-16:]
    return header + b"".join(_long(n) + _long(len(b)) + b + sync for n, b in blocks)


def _long(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _block_ends(data: bytes) -> set[int]:
    """Offsets right after the header and after each block."""
    _, pos = _read_metadata(data, 4)
    pos += 16
    ends = {pos}
    while pos < len(data):
        _, pos = _read_long(data, pos)
        size, pos = _read_long(data, pos)
        pos += size + 16
        ends.add(pos)
    return ends
