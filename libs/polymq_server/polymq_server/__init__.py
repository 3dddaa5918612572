"""polymq_server: what polymq's services share and its client does not need.

The JSON frontends (``polymq_http``, ``polymq_longpoll``, ``polymq_avro``) share who may
call (``access``), the JSON of their requests (``payloads``) and the answer to every error
as RFC 9457 problem details (``problems``). No service imports another service; what two
of them share lives here. Names are imported from their modules.
"""

from __future__ import annotations
