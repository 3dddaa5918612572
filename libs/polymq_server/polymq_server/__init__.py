"""polymq_server: what polymq's services share and its client does not need.

The core and every frontend build on the client (``polymq``) and on this library, which no
client program needs: it brings aiohttp, prometheus-client and fastavro. No service imports
another service; what two of them share lives here. Names are imported from their modules:

- settings and operations: ``config`` (``POLYMQ_...`` settings), ``auth`` (users, grants;
  ``python -m polymq_server.auth``; its parts ``principals``, ``passwords`` and
  ``usersfile``), ``reload`` (reloads without a restart), ``alarms`` (the
  core's resource alarms), ``resources`` (open files and connection limits);
- the frontends' link to the core: ``corelink`` (reconnecting, shared by every frontend);
- HTTP: ``web`` (the aiohttp frontends' base and the core's admin HTTP), ``listener`` (a
  listener that takes at most so many connections), ``problem`` (the RFC 9457 document);
  for the JSON frontends ``problems`` (errors as problem details), ``access`` (who may
  call) and ``payloads`` (request JSON and query checks);
- TCP sessions: ``frontend`` (the STOMP and AMQP frontends' metrics, set-up and session glue)
  and ``transport`` (the TCP/TLS adapter);
- ``connectiongauge``: every service's open client connections under one gauge,
  ``polymq_client_connections{protocol, listener}``;
- messages across protocols: ``avro``, ``avrobounds`` (the nesting and size bounds Avro
  data keeps before fastavro's C reader sees it; ``nesting`` measures decoded data's depth
  without recursion), ``avroview`` and ``jsonview`` (Avro records
  and messages as JSON), ``headers`` (a frontend's own headers), and AMQP's names, exchanges and
  bindings, which the STOMP frontend shares (``names``, ``exchanges``, ``records``,
  ``routing``, ``tagged``).
"""

from __future__ import annotations
