"""The ``polymq`` command: one sub-command per service, and ``run`` for all in one process.

::

    polymq run   [--host H] [--core-port N] [--admin-port N] [--http-port N]
                 [--stomp-port N] [--stomp-ws-port N] [--tls-cert PEM --tls-key PEM]
                 [--longpoll-port N] [--avro-port N] [--amqp-port N] [--amqp-admin-port N]
                 [--amqp-tls-port N] [--data-dir DIR] [--ports-file FILE]
    polymq core  [--host H] [--core-port N] [--admin-port N] [--data-dir DIR]
                 [--tls-cert PEM --tls-key PEM] ...
    polymq http  [--host H] [--http-port N] [--tls-cert PEM --tls-key PEM] [--core HOST:PORT] ...
    polymq stomp [--host H] [--stomp-port N] [--stomp-ws-port N] [--tls-cert PEM --tls-key PEM]
                 [--core HOST:PORT] ...
    polymq longpoll [--host H] [--longpoll-port N] [--tls-cert PEM --tls-key PEM]
                 [--core HOST:PORT] ...
    polymq avro  [--host H] [--avro-port N] [--tls-cert PEM --tls-key PEM] [--core HOST:PORT] ...
    polymq amqp  [--host H] [--amqp-port N|off] [--amqp-admin-port N] [--amqp-tls-port N]
                 [--tls-cert PEM --tls-key PEM] [--core HOST:PORT] [--core-tls-ca PEM] ...

    polymq run   --node-id ID --peers HOST:PORT,... [--cluster-port N] [--nats URL]
                 [--insecure-dev-secret] ...  (POLYMQ_CLUSTER_SECRET required without it)
                 (one node of a replicated core: docs/cluster.md; POLYMQ_K8S_SERVICE instead
                 of or besides --peers: the peers from that Service's endpoints)
    polymq cluster list --admin URL [--timeout S] [--json]
                 (the nodes that answered, as one node's admin API sees them)
    polymq destinations list | connections list | connections close ID | peek DEST |
           publish DEST BODY | purge DEST | consume DEST  [--admin URL] [--json] ...
                 (the operator's commands, clients of a node's admin API: admin_cmd.py)
    polymq check [--http URL] [--longpoll URL] [--avro URL] [--stomp HOST:PORT] [--amqp URL]
                 [--core HOST:PORT] [--timeout S]
                 (one message through each frontend given and back: check_cmd.py, helm test)
    polymq nats  [--peers HOST:PORT,...] [--node-id ID] [--cluster-port N] [--client-port N]
                 (a node's nats-server run apart, for a core given --nats: nats_cmd.py)

    polymq bridge --config LINKS.json [--rabbitmq-url URL] ...
                 (moves messages between polymq and an existing RabbitMQ, both ways)
    polymq spark-push --input FILE --destination KIND/NAME --url AVRO-URL ...
                 (a file into polymq through Spark's format("polymq"); needs the spark extra)

The service commands (``run``, ``core`` and a frontend each) are started by serve_cmd.py,
their flags and settings made by serve_flags.py; each other command is a ``*_cmd.py`` of its
own, and this module puts them under one parser.

A port of 0 picks a free one; ``--ports-file`` receives ``{"core": N, "admin": N, ...}`` once
every listener is bound. When a port is left at its default and that port is taken, a free
one is picked instead (and said). SIGTERM and Ctrl-C stop gracefully: stop accepting on
every listener at once (lame duck), tell connected clients to go elsewhere once what they
sent is answered, finish in-flight writes, flush the store, exit 0.

``--tls-cert``/``--tls-key`` (or ``POLYMQ_TLS_CERT``/``POLYMQ_TLS_KEY``) put a frontend's
listeners on TLS: HTTPS on the ``http``, ``longpoll`` and ``avro`` ports, STOMP over TLS and
WSS on both STOMP ports, and AMQP's extra ``amqps`` listener (``--amqp-port off``: AMQP over
TLS only). In ``run`` they apply to every frontend at once; AMQP's admin port stays plain,
and so do the core's wire and admin ports unless ``--core-tls-cert``/``--core-tls-key`` (on
``polymq core`` also ``--tls-cert``/``--tls-key``) put both on TLS only; a frontend reaches
such a core with ``--core-tls-ca PEM`` (or ``--core-tls``). A certificate or key that is
missing, unreadable or does not load is a configuration error (exit 2).

A replicated core (``--peers``, ``POLYMQ_K8S_SERVICE``) needs ``POLYMQ_CLUSTER_SECRET``
(exit 2 without it) unless ``--insecure-dev-secret`` runs it on a public one.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from polymq_cli.admin_cmd import COMMANDS as ADMIN_COMMANDS
from polymq_cli.serve_flags import add_arguments as serve_arguments
from polymq_cli.serve_flags import common_arguments


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polymq", description="polymq multi-protocol message gateway")
    sub = p.add_subparsers(dest="command", required=True)
    serve_arguments(sub)
    from polymq_cli.cluster_cmd import add_arguments as cluster_arguments

    cluster_arguments(sub)
    from polymq_cli.admin_cmd import add_arguments as admin_arguments

    admin_arguments(sub)
    from polymq_cli.check_cmd import add_arguments as check_arguments

    check_arguments(sub)
    from polymq_cli.nats_cmd import add_arguments as nats_arguments

    nats_arguments(sub)
    bridge = sub.add_parser("bridge", help="move messages between polymq and a RabbitMQ")
    common_arguments(bridge)
    from polymq_bridge.main import add_arguments as bridge_arguments

    bridge_arguments(bridge, common=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["spark-push"]:  # its own options; pyspark is imported only here
        from polymq_spark.cli import main as spark_push

        return spark_push(argv[1:], prog="polymq spark-push")
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command == "cluster":  # a client of a node's admin API
        from polymq_cli.cluster_cmd import run as run_cluster

        return run_cluster(args)
    if args.command in ADMIN_COMMANDS:  # clients of a node's admin API
        from polymq_cli.admin_cmd import run as run_admin

        return run_admin(args)
    if args.command == "check":  # a client of the frontends
        from polymq_cli.check_cmd import run as run_check

        return run_check(args)
    if args.command == "nats":  # becomes nats-server (exec)
        from polymq_cli.nats_cmd import run as run_nats

        return run_nats(args)
    if args.command == "bridge":  # its own service loop, settings and exit codes
        from polymq_bridge.main import run as run_bridge

        return run_bridge(args)
    # the services, imported only here: the core's import costs the other commands ~0.8 s
    from polymq_cli.serve_cmd import run as run_services

    return run_services(args)


if __name__ == "__main__":
    sys.exit(main())
