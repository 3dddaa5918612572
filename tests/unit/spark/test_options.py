"""Write options (polymq_spark.options): defaults, conversions, and an error naming the
option for everything malformed."""

from __future__ import annotations

import pytest

from polymq_spark.errors import OptionError
from polymq_spark.options import parse_options

BASE = {"url": "http://127.0.0.1:8083", "destination": "stream/events"}


def test_defaults() -> None:
    o = parse_options(BASE)
    assert (o.url, o.kind, o.name, o.destination) == (
        "http://127.0.0.1:8083",
        "stream",
        "events",
        "stream/events",
    )
    assert (o.batch_size, o.codec, o.persistent, o.timeout, o.retries) == (
        5000,
        "deflate",
        None,
        30.0,
        5,
    )
    assert o.token is None and o.user is None and o.fail_after_batches is None
    assert o.records_path == "/v1/stream/events/records"


def test_keys_are_case_insensitive_and_values_converted() -> None:
    o = parse_options(
        {
            "URL": "https://h.example:9443/avro/",
            "Destination": "queue/a.b c",
            "BATCHSIZE": "7",
            "codec": "SNAPPY",
            "persistent": "false",
            "subject": "a/b",
            "timeout": "2.5",
            "retries": "0",
            "retryBackoff": "0",
            "failAfterBatches": "2",
            "writeId": "job-42",
        }
    )
    assert o.url == "https://h.example:9443/avro"
    assert (o.kind, o.name, o.batch_size, o.codec) == ("queue", "a.b c", 7, "snappy")
    assert (o.timeout, o.retries, o.retry_backoff, o.fail_after_batches) == (2.5, 0, 0.0, 2)
    assert o.write_id == "job-42"
    assert o.records_path == "/avro/v1/queue/a.b%20c/records?persistent=false&subject=a%2Fb"


def test_path_is_the_destination_when_none_is_given() -> None:
    o = parse_options({"url": BASE["url"], "path": "topic/t"})
    assert o.destination == "topic/t"


def test_auth() -> None:
    assert parse_options({**BASE, "token": "t0k"}).token == "t0k"
    o = parse_options({**BASE, "user": "u", "password": "p"})
    assert (o.user, o.password) == ("u", "p")
    assert "t0k" not in repr(parse_options({**BASE, "token": "t0k"}))
    assert "'p'" not in repr(o)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"destination": "stream/x"}, "url"),
        ({**BASE, "url": "ftp://h/"}, "url"),
        ({**BASE, "url": "http://"}, "url"),
        ({**BASE, "url": "http://h:99999"}, "url"),
        ({**BASE, "url": "http://u:p@h:1"}, "url"),
        ({**BASE, "url": "http://h:1/?a=b"}, "url"),
        ({"url": BASE["url"]}, "destination"),
        ({**BASE, "destination": "events"}, "destination"),
        ({**BASE, "destination": "table/x"}, "destination"),
        ({**BASE, "destination": "stream/"}, "destination"),
        ({**BASE, "batchSize": "0"}, "batchSize"),
        ({**BASE, "batchSize": "many"}, "batchSize"),
        ({**BASE, "batchSize": "2000000"}, "batchSize"),
        ({**BASE, "codec": "zstd"}, "codec"),
        ({**BASE, "persistent": "maybe"}, "persistent"),
        ({**BASE, "user": "u"}, "password"),
        ({**BASE, "password": "p"}, "user"),
        ({**BASE, "token": "t", "user": "u", "password": "p"}, "token"),
        ({**BASE, "token": " "}, "token"),
        ({**BASE, "timeout": "0"}, "timeout"),
        ({**BASE, "timeout": "nan"}, "timeout"),
        ({**BASE, "timeout": "inf"}, "timeout"),
        ({**BASE, "retries": "-1"}, "retries"),
        ({**BASE, "retryBackoff": "-1"}, "retryBackoff"),
        ({**BASE, "recordName": "my row"}, "recordName"),
        ({**BASE, "namespace": "a..b"}, "namespace"),
        ({**BASE, "writeId": "a/b"}, "writeId"),
        ({**BASE, "queryId": ""}, "queryId"),
        ({**BASE, "failAfterBatches": "-1"}, "failAfterBatches"),
        ({**BASE, "subject": ""}, "subject"),
    ],
)
def test_malformed_options_name_the_option(options: dict[str, str], option: str) -> None:
    with pytest.raises(OptionError) as err:
        parse_options(options)
    assert err.value.option == option
    assert f"'{option}'" in str(err.value)
