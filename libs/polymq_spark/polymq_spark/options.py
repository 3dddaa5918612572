"""The write options of format ``"polymq"``, parsed once into a frozen :class:`WriteOptions`.

Spark hands a data source its options as strings with case-insensitive keys; every one is
checked here, on the driver, before any task starts, and a bad one raises
:class:`~polymq_spark.errors.OptionError` naming it. Options this source does not know
(``checkpointLocation``, ``queryName`` and the like, which Spark passes along) are ignored.

========================  ========  ==========================================================
option                    default   meaning
========================  ========  ==========================================================
``url``                   required  the Avro frontend, ``http(s)://host:port[/prefix]``
``destination``           required  ``queue/<name>``, ``topic/<name>`` or ``stream/<name>``
                                    (``save("stream/x")`` sets it too)
``batchSize``             5000      rows per POST (one Avro container, one idempotent batch)
``codec``                 deflate   container codec: ``null``, ``deflate`` or ``snappy``
``persistent``            (server)  ``true``/``false``: the messages' persistent flag
``token``                           ``Authorization: Bearer <token>``
``user``, ``password``              ``Authorization: Basic`` (both, or neither)
``subject``                         the schema registry subject to register the schema under
``timeout``               30        socket timeout in seconds (connect, send, each read)
``retries``               5         further tries of a batch after a 5xx, 408, 429 or a
                                    connection error, with the same ``Idempotency-Key``
``retryBackoff``          0.5       seconds before the first retry; doubles, at most 30 s
``recordName``            Row       the Avro record's name
``namespace``             polymq.spark  the Avro record's namespace
``writeId``               (random)  batch writes: the write id in every batch id; give the
                                    same one to make a re-run of the same job a no-op
``queryId``               (query)   streaming: replaces the query's checkpoint id in batch ids
``summaryFile``                     a path on the driver: commit/abort append one JSON line
``failAfterBatches``                TEST HOOK: fail each task's attempt 0 after N POSTs
========================  ========  ==========================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from .errors import OptionError
from .schema import DEFAULT_NAMESPACE, DEFAULT_RECORD_NAME, valid_name, valid_namespace

__all__ = ["CODECS", "KINDS", "WriteOptions", "parse_options"]

KINDS = ("queue", "topic", "stream")
CODECS = ("null", "deflate", "snappy")
DEFAULT_BATCH_SIZE = 5000
MAX_BATCH_SIZE = 1_000_000
# deflate: with null the one codec the Avro spec requires every reader to support (snappy is
# optional), and the smallest: 5,000 typical rows (long, string, double, timestamp, nullable
# long) make 49 KB deflated, 80 KB with snappy, 166 KB with null, while fastavro took the same
# ~4-7 us a row to write each of the three (the records, not zlib, are the cost), and the
# frontend's time per POST did not differ measurably between them.
DEFAULT_CODEC = "deflate"
_ID = re.compile(r"[A-Za-z0-9._:-]{1,100}\Z")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class WriteOptions:
    url: str  # scheme://host:port[/prefix], no trailing slash
    kind: str
    name: str
    batch_size: int = DEFAULT_BATCH_SIZE
    codec: str = DEFAULT_CODEC
    persistent: bool | None = None
    token: str | None = None
    user: str | None = None
    password: str | None = None
    subject: str | None = None
    timeout: float = 30.0
    retries: int = 5
    retry_backoff: float = 0.5
    record_name: str = DEFAULT_RECORD_NAME
    namespace: str = DEFAULT_NAMESPACE
    write_id: str | None = None
    query_id: str | None = None
    summary_file: str | None = None
    fail_after_batches: int | None = None

    @property
    def destination(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def records_path(self) -> str:
        """The path (and query) a batch is POSTed to, below the URL's own path."""
        base = urlsplit(self.url).path
        path = f"{base}/v1/{self.kind}/{quote(self.name, safe='')}/records"
        query = []
        if self.persistent is not None:
            query.append(f"persistent={'true' if self.persistent else 'false'}")
        if self.subject is not None:
            query.append(f"subject={quote(self.subject, safe='')}")
        return path + ("?" + "&".join(query) if query else "")

    def __repr__(self) -> str:  # never print a secret into a Spark log
        hidden = {"token", "password"}
        parts = []
        for key in self.__dataclass_fields__:
            value = getattr(self, key)
            shown = "'***'" if key in hidden and value is not None else repr(value)
            parts.append(f"{key}={shown}")
        return f"WriteOptions({', '.join(parts)})"


def parse_options(options: Mapping[str, str]) -> WriteOptions:
    """Check and convert the options Spark passed (keys compared case-insensitively)."""
    opts = {k.lower(): v for k, v in options.items()}

    def get(key: str) -> str | None:
        value = opts.get(key.lower())
        return None if value is None else str(value)

    url = _url(get("url"))
    kind, name = _destination(get("destination") or get("path"))
    user, password, token = get("user"), get("password"), get("token")
    if (user is None) != (password is None):
        missing = "password" if password is None else "user"
        raise OptionError(missing, "user and password go together (HTTP Basic)")
    if token is not None and user is not None:
        raise OptionError("token", "give either token (Bearer) or user + password, not both")
    if token is not None and not token.strip():
        raise OptionError("token", "is empty")
    codec = (get("codec") or DEFAULT_CODEC).lower()
    if codec not in CODECS:
        raise OptionError("codec", f"{codec!r} is not one of {', '.join(CODECS)}")
    record_name = get("recordName") or DEFAULT_RECORD_NAME
    if not valid_name(record_name):
        raise OptionError("recordName", f"{record_name!r} is not a valid Avro name")
    namespace = get("namespace")
    namespace = DEFAULT_NAMESPACE if namespace is None else namespace
    if not valid_namespace(namespace):
        raise OptionError("namespace", f"{namespace!r} is not a valid Avro namespace")
    subject = get("subject")
    if subject is not None and not subject:
        raise OptionError("subject", "is empty")
    fail_after = get("failAfterBatches")
    return WriteOptions(
        url=url,
        kind=kind,
        name=name,
        batch_size=_int("batchSize", get("batchSize"), DEFAULT_BATCH_SIZE, 1, MAX_BATCH_SIZE),
        codec=codec,
        persistent=_bool("persistent", get("persistent")),
        token=token,
        user=user,
        password=password,
        subject=subject,
        timeout=_float("timeout", get("timeout"), 30.0, minimum=0.001),
        retries=_int("retries", get("retries"), 5, 0, 100),
        retry_backoff=_float("retryBackoff", get("retryBackoff"), 0.5, minimum=0.0),
        record_name=record_name,
        namespace=namespace,
        write_id=_id("writeId", get("writeId")),
        query_id=_id("queryId", get("queryId")),
        summary_file=get("summaryFile") or None,
        fail_after_batches=(
            None if fail_after is None else _int("failAfterBatches", fail_after, 0, 0, 10**9)
        ),
    )


def _url(raw: str | None) -> str:
    if raw is None or not raw.strip():
        raise OptionError("url", "is required: the Avro frontend, e.g. http://127.0.0.1:8083")
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https"):
        raise OptionError("url", f"{raw!r} must start with http:// or https://")
    if not parts.hostname:
        raise OptionError("url", f"{raw!r} has no host")
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        raise OptionError("url", f"{raw!r}: {exc}") from None
    if parts.query or parts.fragment:
        raise OptionError("url", f"{raw!r} must not carry a query or fragment")
    if parts.username or parts.password:
        raise OptionError("url", "put credentials in the user/password or token options")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def _destination(raw: str | None) -> tuple[str, str]:
    if raw is None or not raw.strip():
        raise OptionError("destination", "is required: queue/<name>, topic/<name> or stream/<name>")
    kind, sep, name = raw.strip().partition("/")
    if not sep or kind not in KINDS or not name:
        raise OptionError(
            "destination",
            f"{raw!r} is not <kind>/<name> with kind one of {', '.join(KINDS)}",
        )
    return kind, name


def _int(option: str, raw: str | None, default: int, minimum: int, maximum: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(option, f"{raw!r} is not an integer") from None
    if not minimum <= value <= maximum:
        raise OptionError(option, f"{value} is outside {minimum}..{maximum}")
    return value


def _float(option: str, raw: str | None, default: float, minimum: float) -> float:
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise OptionError(option, f"{raw!r} is not a number") from None
    if not value >= minimum or value == float("inf"):
        raise OptionError(option, f"{raw!r} must be a finite number >= {minimum}")
    return value


def _bool(option: str, raw: str | None) -> bool | None:
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise OptionError(option, f"{raw!r} is not true or false")


def _id(option: str, raw: str | None) -> str | None:
    if raw is None:
        return None
    if not _ID.match(raw):
        raise OptionError(option, f"{raw!r}: use 1 to 100 of A-Z a-z 0-9 . _ : -")
    return raw
