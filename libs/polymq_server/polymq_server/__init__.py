"""polymq_server: what polymq's services share and its client does not need.

The core and every frontend build on the client (``polymq``) and on this library, which no
client program needs: it brings aiohttp, prometheus-client and fastavro. No service imports
another service; what two of them share lives here, in folders by concern (each
``__init__`` says what it may import; ``lint-imports`` keeps them free of cycles). Names are
imported from their modules:

- at the top, settings and operations: ``config`` (``POLYMQ_...`` settings), ``reload``
  (reloads without a restart), ``alarms`` (the core's resource alarms), ``resources`` (open
  files and connection limits), ``names`` (AMQP names and the core's, both ways);
- ``auth/``: who a client is and what it may do: ``provider`` (the interface;
  ``python -m polymq_server.auth.provider``), ``principals``, ``passwords``, ``usersfile``,
  ``logins``, ``deadletter``;
- ``link/``: the frontends' link to the core: ``corelink`` (reconnecting, shared by every
  frontend), ``connections`` (client connections as the operator sees them) and
  ``connectiongauge`` (``polymq_client_connections{protocol, listener}``);
- ``web/``: HTTP: ``app`` (the aiohttp frontends' base and the core's admin HTTP),
  ``listener`` (at most so many connections), ``guards``, ``access`` (who may call),
  ``problemdoc`` (the RFC 9457 document) and ``problems`` (errors as problem details),
  ``requestmetrics``, and for the JSON frontends ``payloads`` and ``receipts``;
- ``sessions/``: the TCP frontends' (STOMP, AMQP) ``frontend`` (metrics, set-up and session
  glue) and ``transport`` (the TCP/TLS adapter);
- ``messages/``: messages across protocols: ``avro``, ``avrobounds`` (the bounds Avro data
  keeps before fastavro's C reader sees it), ``nesting`` (decoded data's depth, without
  recursion), ``avroview`` and ``jsonview`` (records and messages as JSON), ``headers`` (a
  frontend's own headers) and ``tagged`` (AMQP header values through the core);
- ``exchanges/``: AMQP's exchanges, which the STOMP frontend shares: ``kinds`` (exchange
  types), ``records`` (exchanges and bindings in the core's key/value store) and
  ``resolution`` (where a publish to an exchange goes).
"""

from __future__ import annotations
