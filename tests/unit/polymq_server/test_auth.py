from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from polymq.errors import Forbidden, Unauthorized
from polymq_server.auth import passwords
from polymq_server.auth import provider as auth
from polymq_server.auth.provider import (
    AnonymousProvider,
    FileProvider,
    Permission,
    authenticate_http,
    hash_password,
    hash_token,
    load_provider,
    parse_authorization,
    verify_password,
)

ALICE_PASSWORD = "correct horse battery staple"
BOT_TOKEN = "bot-token-0123456789"


@pytest.fixture(scope="module")
def alice_hash() -> str:
    return hash_password(ALICE_PASSWORD)


def config(alice_hash: str, *, anonymous: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "users": {
            "alice": {
                "password_hash": alice_hash,
                "grants": [
                    {"pattern": "queue/orders.*", "permissions": ["read", "write"]},
                    {"pattern": "topic/news.*", "permissions": ["read"]},
                ],
            },
            "bot": {"grants": [{"pattern": "*", "permissions": ["configure"]}]},
        },
        "tokens": {hash_token(BOT_TOKEN): {"user": "bot"}},
    }
    if anonymous:
        doc["anonymous"] = {"grants": [{"pattern": "topic/public.*", "permissions": ["read"]}]}
    return doc


def write(path: Path, doc: Any) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.fixture
def provider(tmp_path: Path, alice_hash: str) -> FileProvider:
    return FileProvider(write(tmp_path / "users.json", config(alice_hash)))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# --- password and token hashing ------------------------------------------------------------


def test_hash_verify_round_trip_and_wrong_password(alice_hash: str) -> None:
    assert alice_hash.startswith("scrypt$131072$8$1$")  # OWASP's N=2^17, r=8, p=1
    assert verify_password(ALICE_PASSWORD, alice_hash)
    assert not verify_password(ALICE_PASSWORD + "x", alice_hash)
    assert not verify_password("", alice_hash)


def test_two_hashes_of_one_password_differ_by_salt() -> None:
    a, b = hash_password("pw"), hash_password("pw")
    assert a != b
    assert a.split("$")[4] != b.split("$")[4]
    assert verify_password("pw", a) and verify_password("pw", b)


@pytest.mark.parametrize("encoded", ["", "plain", "scrypt$16384$8$1$!!$!!", "md5$1$2$3$YQ==$YQ=="])
def test_verify_rejects_a_malformed_hash(encoded: str) -> None:
    with pytest.raises(ValueError, match="password hash"):
        verify_password("pw", encoded)


def test_token_helpers() -> None:
    token = auth.generate_token()
    assert len(token) >= 40 and token != auth.generate_token()
    assert hash_token(token) == hashlib.sha256(token.encode()).hexdigest()


# --- the file provider --------------------------------------------------------------------


async def test_file_provider_grants_and_refuses_per_pattern_and_permission(
    provider: FileProvider,
) -> None:
    alice = await provider.authenticate_password("alice", ALICE_PASSWORD)
    assert (alice.name, alice.anonymous) == ("alice", False)
    provider.authorize(alice, Permission.WRITE, "queue/orders.eu")
    provider.authorize(alice, Permission.READ, "queue/orders.eu.late")
    provider.authorize(alice, Permission.READ, "topic/news.sport")
    provider.authorize(alice, Permission.READ, "topic/news.*")  # a subscription pattern
    provider.authorize(alice, Permission.READ, "topic/news.*.#")
    refused = [
        (Permission.CONFIGURE, "queue/orders.eu"),  # right pattern, wrong permission
        (Permission.WRITE, "topic/news.sport"),
        (Permission.WRITE, "queue/orders"),  # "orders.*" needs the dot
        (Permission.READ, "queue/other"),
        (Permission.READ, "stream/orders.eu"),
        (Permission.READ, "topic/#"),  # wider than topic/news.*
        (Permission.READ, "topic/news.#"),  # hears topic/news too, which "news.*" is not
    ]
    for permission, destination in refused:
        with pytest.raises(Forbidden) as e:
            provider.authorize(alice, permission, destination)
        assert e.value.status == 403
        message = str(e.value)
        assert "alice" in message and permission.value in message and destination in message


async def test_star_grant_covers_everything(provider: FileProvider) -> None:
    bot = await provider.authenticate_token(BOT_TOKEN)
    for destination in ("queue/a", "topic/x.#", "stream/s", "channel/c"):
        provider.authorize(bot, Permission.CONFIGURE, destination)
    with pytest.raises(Forbidden):
        provider.authorize(bot, Permission.READ, "queue/a")


async def test_unknown_user_and_wrong_password_are_the_same_401(provider: FileProvider) -> None:
    messages = []
    for user, password in [("alice", "wrong"), ("mallory", ALICE_PASSWORD), ("bot", "x")]:
        with pytest.raises(Unauthorized) as e:
            await provider.authenticate_password(user, password)
        assert e.value.status == 401
        messages.append(str(e.value))
    assert len(set(messages)) == 1
    assert "mallory" not in messages[0]


async def test_unknown_user_costs_a_scrypt_too(
    provider: FileProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    passwords._dummy_hash()  # made once, before counting
    calls = []
    real = hashlib.scrypt

    def counting(*args: Any, **kwargs: Any) -> bytes:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(passwords.hashlib, "scrypt", counting)
    with pytest.raises(Unauthorized):
        await provider.authenticate_password("mallory", "pw")
    assert calls == [1]


async def test_password_check_does_not_block_the_event_loop(provider: FileProvider) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    await provider.authenticate_password("alice", ALICE_PASSWORD)
    during = ticks - before
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert during > 1


async def test_tokens_authenticate_and_a_wrong_token_is_401(provider: FileProvider) -> None:
    bot = await provider.authenticate_token(BOT_TOKEN)
    assert (bot.name, bot.anonymous) == ("bot", False)
    for wrong in ("nope", BOT_TOKEN + "x", hash_token(BOT_TOKEN)):  # the stored hash is no token
        with pytest.raises(Unauthorized) as e:
            await provider.authenticate_token(wrong)
        assert e.value.status == 401


async def test_anonymous_refused_when_not_configured(provider: FileProvider) -> None:
    with pytest.raises(Unauthorized, match="anonymous access is off"):
        await provider.anonymous()
    assert "anonymous access off" in provider.describe()


async def test_anonymous_allowed_with_its_grants(tmp_path: Path, alice_hash: str) -> None:
    p = FileProvider(write(tmp_path / "u.json", config(alice_hash, anonymous=True)))
    anon = await p.anonymous()
    assert anon.anonymous
    p.authorize(anon, Permission.READ, "topic/public.weather")
    with pytest.raises(Forbidden, match="anonymous"):
        p.authorize(anon, Permission.WRITE, "topic/public.weather")
    with pytest.raises(Forbidden):
        p.authorize(anon, Permission.READ, "queue/orders.eu")


async def test_reload_rereads_the_file_and_keeps_the_old_one_on_error(
    tmp_path: Path, alice_hash: str
) -> None:
    path = write(tmp_path / "u.json", config(alice_hash))
    p = FileProvider(path)
    with pytest.raises(Unauthorized):
        await p.anonymous()
    write(path, config(alice_hash, anonymous=True))
    p.reload()
    assert (await p.anonymous()).anonymous
    write(path, "{not json")
    with pytest.raises(ValueError, match=str(path)):
        p.reload()
    assert (await p.anonymous()).anonymous
    assert (await p.authenticate_token(BOT_TOKEN)).name == "bot"


async def test_refresh_follows_a_reload_of_the_logins_and_grants(
    tmp_path: Path, alice_hash: str
) -> None:
    """After a reload, a login is what the file says now: the same principal while nothing
    of it changed, its new grants, or None once its user, password or token is gone."""
    path = write(tmp_path / "u.json", config(alice_hash, anonymous=True))
    p = FileProvider(path)
    alice = await p.authenticate_password("alice", ALICE_PASSWORD)
    bot = await p.authenticate_token(BOT_TOKEN)
    anon = await p.anonymous()
    assert "scrypt" not in repr(alice)  # (what it logged in with is not shown)
    p.reload()
    assert p.refresh(alice) is alice and p.refresh(bot) is bot and p.refresh(anon) is anon
    doc = config(alice_hash, anonymous=True)
    doc["users"]["alice"]["grants"] = [{"pattern": "queue/other", "permissions": ["read"]}]
    write(path, doc)
    p.reload()
    now = p.refresh(alice)
    assert now is not None and now.name == "alice"
    assert now.allows(Permission.READ, "queue/other")
    assert not now.allows(Permission.READ, "queue/orders.eu")
    assert p.refresh(now) is now
    # a token login outlives a password change, and the other way round
    doc["users"]["alice"]["password_hash"] = hash_password("new password")
    doc["users"]["bot"]["password_hash"] = alice_hash
    write(path, doc)
    p.reload()
    assert p.refresh(alice) is None
    assert p.refresh(bot) is not None
    doc["tokens"] = {}
    del doc["anonymous"]
    write(path, doc)
    p.reload()
    assert p.refresh(bot) is None and p.refresh(anon) is None
    del doc["users"]["alice"]
    write(path, doc)
    p.reload()
    assert p.refresh(await p.authenticate_password("bot", ALICE_PASSWORD)) is not None
    # a user removed while its password was checked is refused
    login = asyncio.ensure_future(p.authenticate_password("bot", ALICE_PASSWORD))
    await asyncio.sleep(0)
    write(path, {"users": {}})
    p.reload()
    with pytest.raises(Unauthorized):
        await login


def test_refresh_of_the_service_token_and_the_anonymous_provider(
    provider: FileProvider,
) -> None:
    service = auth.WithServiceToken(provider, "s" * 32)
    internal = asyncio.run(service.authenticate_token("s" * 32))
    assert service.refresh(internal) is internal
    alice = asyncio.run(service.authenticate_password("alice", ALICE_PASSWORD))
    assert service.refresh(alice) is alice
    anyone = asyncio.run(AnonymousProvider().authenticate_password("x", "y"))
    assert AnonymousProvider().refresh(anyone) is anyone


def _mutate(alice_hash: str, change: str) -> Any:
    doc = config(alice_hash)
    alice = doc["users"]["alice"]
    if change == "permission":
        alice["grants"][0]["permissions"] = ["read", "wirte"]
    elif change == "clear_token":
        doc["tokens"] = {BOT_TOKEN: {"user": "bot"}}
    elif change == "token_user":
        doc["tokens"] = {hash_token("t"): {"user": "carol"}}
    elif change == "password_hash":
        alice["password_hash"] = "hunter2"
    elif change == "top_key":
        doc["user"] = {}
    elif change == "grant_key":
        alice["grants"][0]["permission"] = ["read"]
    elif change == "pattern":
        alice["grants"][0]["pattern"] = "queues/*"
    elif change == "not_json":
        return '{"users": '
    return doc


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("permission", "user 'alice', grant 1: unknown permission 'wirte'"),
        ("clear_token", "sha256 hex"),
        ("token_user", "'carol'"),
        ("password_hash", "user 'alice': password hash must be 'scrypt$"),
        ("top_key", "unknown key(s) 'user'"),
        ("grant_key", "unknown key(s) 'permission'"),
        ("pattern", "pattern 'queues/*' can never match"),
        ("not_json", "Expecting value"),
    ],
)
def test_malformed_file_raises_value_error_naming_file_and_problem(
    tmp_path: Path, alice_hash: str, change: str, expected: str
) -> None:
    path = write(tmp_path / "bad.json", _mutate(alice_hash, change))
    with pytest.raises(ValueError) as e:
        FileProvider(path)
    assert str(e.value).startswith(f"auth file {path}: ")
    assert expected in str(e.value)


# --- key/value grants ---------------------------------------------------------------------

KV_GRANTS = {
    # the schema registry's keys, read only (a consumer that decodes records)
    "schemas": [{"pattern": "kv/avro/*", "permissions": ["read"]}],
    # an AMQP frontend that serves the vhost "prod" only, and its heartbeats
    "amqp-prod": [
        {"pattern": "kv/amqp/?/prod/*", "permissions": ["read", "write"]},
        {"pattern": "kv/amqp/i/*", "permissions": ["read", "write"]},
    ],
}


@pytest.fixture
def kv_provider(tmp_path: Path) -> FileProvider:
    users = {name: {"grants": grants} for name, grants in KV_GRANTS.items()}
    tokens = {hash_token(f"{name}-token"): {"user": name} for name in KV_GRANTS}
    return FileProvider(write(tmp_path / "kv.json", {"users": users, "tokens": tokens}))


async def test_kv_grants_narrow_to_the_registry_keys(kv_provider: FileProvider) -> None:
    reader = await kv_provider.authenticate_token("schemas-token")
    for key in ("avro/schemas/7f3a", "avro/subjects/orders", "avro/versions/orders/1"):
        kv_provider.authorize(reader, Permission.READ, f"kv/{key}")
    for prefix in ("avro/", "avro/subjects/", "avro/schemas/7"):
        kv_provider.authorize_prefix(reader, Permission.READ, f"kv/{prefix}")
    refused = [
        (Permission.WRITE, "kv/avro/subjects/orders"),  # read only
        (Permission.READ, "kv/amqp/x/prod/orders"),
        (Permission.READ, "kv/avrox/schemas/1"),
        (Permission.READ, "queue/avro"),  # kv/ grants name keys, not destinations
    ]
    for permission, destination in refused:
        with pytest.raises(Forbidden, match=f"user 'schemas' has no {permission.value}"):
            kv_provider.authorize(reader, permission, destination)
    for prefix in ("", "av", "amqp/"):
        with pytest.raises(Forbidden) as e:
            kv_provider.authorize_prefix(reader, Permission.READ, f"kv/{prefix}")
        assert f"read permission on 'kv/{prefix}*'" in str(e.value)


async def test_kv_grants_narrow_to_one_vhost_of_amqp(kv_provider: FileProvider) -> None:
    amqp = await kv_provider.authenticate_token("amqp-prod-token")
    for key in (
        "amqp/x/prod/orders",
        "amqp/q/prod/work",
        "amqp/b/prod/work/orders/0a1b",
        "amqp/e/prod/orders/work/0a1b",
        "amqp/i/host-1",
    ):
        for permission in (Permission.READ, Permission.WRITE):
            kv_provider.authorize(amqp, permission, f"kv/{key}")
    kv_provider.authorize_prefix(amqp, Permission.READ, "kv/amqp/b/prod/work/")
    kv_provider.authorize_prefix(amqp, Permission.READ, "kv/amqp/e/prod/orders/")
    for key in ("amqp/x/test/orders", "amqp/q/:2F/work", "amqp/q/production/work", "avro/x"):
        with pytest.raises(Forbidden):
            kv_provider.authorize(amqp, Permission.WRITE, f"kv/{key}")
    for prefix in ("amqp/", "amqp/b/", "amqp/b/test/work/"):
        with pytest.raises(Forbidden):
            kv_provider.authorize_prefix(amqp, Permission.READ, f"kv/{prefix}")
    with pytest.raises(Forbidden):
        kv_provider.authorize(amqp, Permission.CONFIGURE, "kv/amqp/x/prod/orders")


@pytest.mark.parametrize(
    ("pattern", "prefix", "allowed"),
    [
        ("*", "kv/", True),
        ("kv/*", "kv/", True),
        ("k*", "kv/a", True),
        ("kv/a/*", "kv/a/", True),
        ("kv/a/*", "kv/a/b/c", True),
        ("kv/a*", "kv/a/", True),
        ("kv/a/*", "kv/a", False),  # "kv/ab" starts with it too
        ("kv/a/*", "kv/", False),
        ("kv/a/", "kv/a/", False),  # one key, not what starts with it
        # "?" and "[...]" match the "*" of "kv/a/*" as text, but not every key under kv/a/:
        ("kv/a/?*", "kv/a/", False),
        ("kv/a/?", "kv/a/", False),
        ("kv/a/[bc]*", "kv/a/", False),
        ("kv/a/[bc]*", "kv/a/b", True),
        ("kv/a/[*]", "kv/a/", False),
    ],
)
def test_listing_needs_a_grant_that_covers_every_key_under_the_prefix(
    pattern: str, prefix: str, allowed: bool
) -> None:
    principal = auth.Principal(
        "u", anonymous=False, grants=(auth.Grant(pattern, {Permission.READ}),)
    )
    assert principal.allows_prefix(Permission.READ, prefix) is allowed
    assert not principal.allows_prefix(Permission.WRITE, prefix)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("kv/", "pattern 'kv/' names no key: write kv/<key>, or kv/<prefix>*"),
        ("kv/avro/", "is the one key 'avro/', not the keys under it: write 'kv/avro/*'"),
        ("kv/avro/schemas/[0-9", "has a '[' without a closing ']': write '[[]'"),
        ("kv/a[]/*", "has a '[' without a closing ']'"),  # "]" first is a member of the set
        ("kv/a[!]b", "has a '[' without a closing ']'"),
        ("kv", "pattern 'kv' can never match: destinations start with queue/"),
        ("kvs/*", "can never match"),
        ("kv:avro/*", "can never match"),
        ("/kv/avro/*", "can never match"),
    ],
)
def test_malformed_kv_pattern_is_refused_with_a_hint(
    tmp_path: Path, pattern: str, expected: str
) -> None:
    doc = {"users": {"u": {"grants": [{"pattern": pattern, "permissions": ["read"]}]}}}
    with pytest.raises(ValueError) as e:
        FileProvider(write(tmp_path / "kv.json", doc))
    assert f"user 'u', grant 1: pattern {pattern!r} " in str(e.value)
    assert expected in str(e.value)
    assert "key/value keys with kv/" in str(e.value) or pattern.startswith("kv/")


async def test_grant_patterns_that_loaded_before_still_load(tmp_path: Path) -> None:
    patterns = ["*", "k*", "*/public.*", "queue/a[", "queue/", "topic/[ab]*", "?*"]
    patterns += ["kv/*", "kv/a[/]", "kv/[[]x", "kv/a[]]b", "kv/amqp/?/:2F/*", "kv/x"]
    doc = {"users": {"u": {"grants": [{"pattern": p, "permissions": ["read"]} for p in patterns]}}}
    doc["tokens"] = {hash_token("t"): {"user": "u"}}
    provider = FileProvider(write(tmp_path / "ok.json", doc))
    u = await provider.authenticate_token("t")
    assert [g.pattern for g in u.grants] == patterns
    provider.authorize(u, Permission.READ, "kv/a/")  # kv/a[/]: that one key
    provider.authorize(u, Permission.READ, "kv/[x")
    provider.authorize(u, Permission.READ, "kv/a]b")


def test_missing_file_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read it"):
        FileProvider(tmp_path / "absent.json")


# --- the anonymous provider and load_provider -----------------------------------------------


async def test_anonymous_provider_lets_everyone_do_everything() -> None:
    p = AnonymousProvider()
    assert "anonymous mode" in p.describe()
    principals = [
        await p.anonymous(),
        await p.authenticate_password("bob", "anything"),
        await p.authenticate_token("anything"),
    ]
    assert principals[0].anonymous and principals[1].name == "bob"
    for principal in principals:
        for permission in Permission:
            p.authorize(principal, permission, "queue/any")
            p.authorize(principal, permission, "topic/#")


def test_load_provider(tmp_path: Path, alice_hash: str) -> None:
    for spec in (None, "", "anonymous"):
        assert isinstance(load_provider(spec), AnonymousProvider)
    path = write(tmp_path / "u.json", config(alice_hash))
    loaded = load_provider(f"file:{path}")
    assert isinstance(loaded, FileProvider) and loaded.path == str(path)
    for spec in ("ldap://x", "file:", "Anonymous"):
        with pytest.raises(ValueError, match="use 'anonymous' or 'file:"):
            load_provider(spec)


# --- HTTP ---------------------------------------------------------------------------------


def test_parse_authorization() -> None:
    assert parse_authorization(None) is None
    assert parse_authorization("  ") is None
    assert parse_authorization(basic("alice", "a:b c")) == ("basic", "alice", "a:b c")
    assert parse_authorization("bAsIc " + basic("u", "p")[6:]) == ("basic", "u", "p")
    assert parse_authorization("Bearer abc.def") == ("bearer", "abc.def", "")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Basic !!!notbase64", "not base64"),
        ("Basic dTpw!", "not base64"),  # "u:p" plus a stray character
        ("Basic " + base64.b64encode(b"no-colon").decode(), "no ':'"),
        ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), "not base64 of utf-8"),
        ("Bearer ", "no token"),
        ("Digest username=alice", "unsupported authorization scheme 'Digest'"),
    ],
)
def test_parse_authorization_refuses_malformed_headers(header: str, expected: str) -> None:
    with pytest.raises(Unauthorized, match=expected) as e:
        parse_authorization(header)
    assert e.value.status == 401


async def test_authenticate_http(provider: FileProvider) -> None:
    assert (await authenticate_http(provider, basic("alice", ALICE_PASSWORD))).name == "alice"
    assert (await authenticate_http(provider, f"Bearer {BOT_TOKEN}")).name == "bot"
    with pytest.raises(Unauthorized, match="anonymous access is off"):
        await authenticate_http(provider, None)
    with pytest.raises(Unauthorized, match="invalid user name or password"):
        await authenticate_http(provider, basic("alice", "nope"))
    assert (await authenticate_http(AnonymousProvider(), None)).anonymous


# --- CLI ----------------------------------------------------------------------------------


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(auth.__file__).resolve().parents[2]))
    return subprocess.run(
        [sys.executable, "-m", "polymq_server.auth.provider", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_cli_hash_password() -> None:
    done = run_cli("hash-password", stdin="s3cret\n")
    assert done.returncode == 0, done.stderr
    encoded = done.stdout.strip()
    assert verify_password("s3cret", encoded)
    assert not verify_password("s3cret\n", encoded)
    empty = run_cli("hash-password", stdin="")
    assert empty.returncode != 0 and "empty password" in empty.stderr


def test_cli_new_token() -> None:
    done = run_cli("new-token")
    assert done.returncode == 0, done.stderr
    fields = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert set(fields) == {"token", "sha256"}
    assert hash_token(fields["token"]) == fields["sha256"]


# --- management tags (the core's admin API) ------------------------------------------------


async def test_users_carry_their_management_tags(tmp_path: Path, alice_hash: str) -> None:
    doc = config(alice_hash)
    doc["users"]["alice"]["tags"] = ["monitoring"]
    doc["users"]["bot"]["tags"] = ["administrator", "monitoring"]
    p = FileProvider(write(tmp_path / "u.json", doc))
    alice = await p.authenticate_password("alice", ALICE_PASSWORD)
    assert alice.tags == frozenset({"monitoring"})
    bot = await p.authenticate_token(BOT_TOKEN)
    assert bot.tags == frozenset({"administrator", "monitoring"})
    assert not p.open and AnonymousProvider().open
    # polymq's own links (the service token) may do everything there too
    wrapped = auth.WithServiceToken(p, "s" * 40)
    assert (await wrapped.authenticate_token("s" * 40)).tags == frozenset({"administrator"})
    assert not wrapped.open and auth.WithServiceToken(AnonymousProvider(), "s" * 40).open


@pytest.mark.parametrize(
    ("tags", "expected"),
    [("monitoring", "'tags' must be a list"), (["root"], "unknown tag(s) 'root'"), ([1], "list")],
)
def test_malformed_tags_are_refused(
    tmp_path: Path, alice_hash: str, tags: Any, expected: str
) -> None:
    doc = config(alice_hash)
    doc["users"]["alice"]["tags"] = tags
    with pytest.raises(ValueError, match=r"user 'alice'") as info:
        FileProvider(write(tmp_path / "u.json", doc))
    assert expected in str(info.value)
