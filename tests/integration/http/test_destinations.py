"""Declare, stats, purge, delete and metadata over HTTP."""

from __future__ import annotations

import jsonschema

from .conftest import Api, assert_problem, unique


def test_declare_stats_purge_delete(api: Api) -> None:
    q = unique()
    r = api.put(f"/v1/queue/{q}", json={"max_length": 2, "overflow": "reject", "durable": True})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "destination": f"queue/{q}",
        "options": {"durable": True, "overflow": "reject", "max_length": 2},
    }
    # declaring again with the same options is fine; with others it conflicts
    assert api.put(f"/v1/queue/{q}", json={"max_length": 2}).status_code == 200
    assert_problem(api.put(f"/v1/queue/{q}", json={"max_length": 3}), 409)

    api.publish(f"queue/{q}", {"messages": [{"body": "1"}, {"body": "2"}]})
    full = assert_problem(api.post(f"/v1/queue/{q}/messages", json={"body": "3"}), 429)
    assert full["code"] == "queue-full"

    stats = api.get(f"/v1/queue/{q}").json()
    assert stats["destination"] == f"queue/{q}"
    assert stats["messages"] == 2 and stats["in_flight"] == 0 and stats["subscribers"] == 0
    assert stats["options"]["max_length"] == 2

    r = api.post(f"/v1/queue/{q}/purge")
    assert r.status_code == 200 and r.json() == {"purged": 2}
    assert api.get(f"/v1/queue/{q}").json()["messages"] == 0

    r = api.delete(f"/v1/queue/{q}")
    assert r.status_code == 200 and r.json() == {"deleted": f"queue/{q}"}
    assert_problem(api.get(f"/v1/queue/{q}"), 404)
    assert_problem(api.delete(f"/v1/queue/{q}"), 404)
    assert_problem(api.post(f"/v1/queue/{q}/purge"), 404)


def test_declare_without_body_uses_defaults(api: Api) -> None:
    q = unique()
    r = api.put(f"/v1/queue/{q}")
    assert r.status_code == 200, r.text
    assert r.json()["options"] == {"durable": True, "overflow": "reject"}


def test_metadata(api: Api) -> None:
    q = unique()
    assert_problem(api.get(f"/v1/queue/{q}/metadata"), 404)
    api.put(f"/v1/queue/{q}")
    assert api.get(f"/v1/queue/{q}/metadata").json() == {}
    r = api.put(f"/v1/queue/{q}/metadata", json={"owner": "team-a", "purpose": "tests"})
    assert r.status_code == 200 and r.json() == {"owner": "team-a", "purpose": "tests"}
    assert api.get(f"/v1/queue/{q}/metadata").json() == {"owner": "team-a", "purpose": "tests"}
    assert_problem(api.put(f"/v1/queue/{q}/metadata", json={"n": 1}), 400)


def test_stream_and_channel_stats(api: Api) -> None:
    s, ch = unique(), unique()
    api.publish(f"stream/{s}", {"messages": [{"body": "a"}, {"body": "b"}]})
    stats = api.get(f"/v1/stream/{s}").json()
    assert stats["messages"] == 2 and stats["first_seq"] == 1 and stats["last_seq"] == 2

    api.put(f"/v1/channel/{ch}")
    api.publish(f"channel/{ch}", {"body": "to the server", "role": "client"})
    stats = api.get(f"/v1/channel/{ch}").json()
    assert stats["destination"] == f"channel/{ch}"
    assert stats["server"]["messages"] == 1 and stats["client"]["messages"] == 0


def test_a_channel_with_one_inbox_answers_as_documented(api: Api) -> None:
    """A publish makes only the inbox it fills: the other is answered as an AbsentInbox,
    which the OpenAPI document's ChannelStats allows (schemathesis may not reach it)."""
    ch = unique()
    api.publish(f"channel/{ch}", {"body": "to the server", "role": "client"})
    stats = api.get(f"/v1/channel/{ch}").json()
    assert stats["server"]["messages"] == 1 and stats["server"]["options"]
    assert stats["client"] == {"destination": f"channel/{ch}>client", "messages": 0}
    doc = api.get("/openapi.json").json()
    schema = {"$ref": "#/components/schemas/ChannelStats", "components": doc["components"]}
    jsonschema.validate(stats, schema, cls=jsonschema.Draft202012Validator)
    api.put(f"/v1/channel/{ch}")  # (declaring makes the other)
    full = api.get(f"/v1/channel/{ch}").json()
    assert full["client"]["options"] and full["client"]["in_flight"] == 0
    jsonschema.validate(full, schema, cls=jsonschema.Draft202012Validator)


def test_topics_hold_nothing_to_manage(api: Api) -> None:
    t = unique()
    assert api.put(f"/v1/topic/{t}").json() == {"destination": f"topic/{t}"}
    assert api.get(f"/v1/topic/{t}").json() == {"destination": f"topic/{t}", "subscribers": 0}
    assert_problem(api.delete(f"/v1/topic/{t}"), 400)
    assert_problem(api.post(f"/v1/topic/{t}/purge"), 400)
    assert_problem(api.put(f"/v1/topic/{t}/metadata", json={}), 400)
