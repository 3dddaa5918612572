"""Idempotent batches: a POST retried with the same ``Idempotency-Key`` (or ``X-Batch-Id``)
and the same records publishes nothing again and answers like the first, with
``"duplicate": true``; the queue holds each record once."""

from __future__ import annotations

import concurrent.futures

from polymq_server.messages.avro import encode_single, parse

from .conftest import USER, Avro, container, unique, users


def test_a_retried_batch_is_published_once(api: Avro) -> None:
    queue = f"queue/{unique('idem')}"
    records = users(500)
    key = {"Idempotency-Key": unique("key")}
    first = api.published(queue, container(records, codec="deflate"), headers=key)
    assert first["duplicate"] is False and first["count"] == 500
    # the producer writes its file again (another sync marker, even another codec)
    again = api.published(queue, container(records, codec="snappy"), headers=key)
    assert again["duplicate"] is True
    assert again["ids"] == first["ids"] and again["seqs"] == first["seqs"]
    assert again["count"] == first["count"]
    assert api.stats(queue)["messages"] == 500 and api.stats(queue)["published"] == 500


def test_x_batch_id_is_the_same_key(api: Avro) -> None:
    queue = f"queue/{unique('idem')}"
    body = container(users(10))
    key = unique("b")
    assert not api.published(queue, body, headers={"X-Batch-Id": key})["duplicate"]
    assert api.published(queue, body, headers={"Idempotency-Key": key})["duplicate"]
    assert api.stats(queue)["messages"] == 10


def test_without_a_key_or_with_another_key_a_batch_is_published_again(api: Avro) -> None:
    queue = f"queue/{unique('idem')}"
    body = container(users(10))
    api.published(queue, body)
    api.published(queue, body)
    api.published(queue, body, headers={"Idempotency-Key": "k-one"})
    assert not api.published(queue, body, headers={"Idempotency-Key": "k-two"})["duplicate"]
    assert api.stats(queue)["messages"] == 40


def test_the_same_key_with_other_records_is_not_a_retry(api: Avro) -> None:
    """A key reused for other records publishes them (nothing is lost silently): the
    batch is what a retry repeats, the key and the records together."""
    queue = f"queue/{unique('idem')}"
    key = {"Idempotency-Key": unique("key")}
    api.published(queue, container(users(10)), headers=key)
    other = api.published(queue, container(users(10, start=10)), headers=key)
    assert other["duplicate"] is False
    assert api.stats(queue)["messages"] == 20


def test_single_object_batches_and_streams_too(api: Avro) -> None:
    schema = parse(USER)
    assert api.register(unique("subj"), USER).status_code == 200
    body = b"".join(encode_single(schema, r) for r in users(20))
    stream = f"stream/{unique('idem')}"
    key = {"Idempotency-Key": unique("key")}
    first = api.published(stream, body, content_type="avro/binary", headers=key)
    again = api.published(stream, body, content_type="avro/binary", headers=key)
    assert again["duplicate"] and again["seqs"] == first["seqs"]
    assert api.stats(stream)["messages"] == 20


def test_concurrent_retries_publish_once(api: Avro) -> None:
    queue = f"queue/{unique('idem')}"
    body = container(users(2000))
    key = {"Idempotency-Key": unique("key")}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(lambda _: api.fresh().published(queue, body, headers=key), range(4))
        )
    assert sorted(a["duplicate"] for a in answers) == [False, True, True, True]
    assert all(a["ids"] == answers[0]["ids"] for a in answers)
    assert api.stats(queue)["messages"] == 2000
