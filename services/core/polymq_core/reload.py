"""Reloads in the core (:mod:`polymq_server.reload` says what a reload is and applies it).

In a cluster a reload is broadcast between the nodes on the NATS subject :data:`SUBJECT`
and every node applies it; each node announces the version it applied last on
``system.peers`` (``config_version``), so ``polymq cluster list`` shows a node that missed
one. On one node it is applied at once. Either way, a node that applied a reload publishes it
on its topic ``system.config`` for the frontends connected to it (:func:`publish`).
:func:`limits_setter` is how a reload's ``limits`` reach the broker's settings, and
:func:`page` the console's form for a reload (``GET /reload`` on the admin port).
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Callable
from typing import Any

from polymq.types import Message
from polymq_server.config import ConfigError
from polymq_server.names import core_headers
from polymq_server.reload import LEVELS, LIMITS, TOPIC, Reloader, ReloadError, new_change

from .broker import Broker

__all__ = [
    "LEVELS",
    "SUBJECT",
    "ReloadError",
    "Reloader",
    "limits_setter",
    "new_change",
    "page",
    "publisher",
]

SUBJECT = "polymq.system.config"


def limits_setter(broker: Broker) -> Callable[[dict[str, Any]], None]:
    """Sets a reload's limits on ``broker``'s settings (read where each limit is enforced,
    so new requests follow them at once), checked as at start-up."""

    def set_limits(limits: dict[str, Any]) -> None:
        settings = dataclasses.replace(broker.settings, **limits)
        try:
            settings.check()
        except ConfigError as exc:
            raise ReloadError(str(exc)) from exc
        broker.settings = settings

    return set_limits


def publisher(broker: Broker) -> Callable[[dict[str, Any]], None]:
    """Publishes each applied reload on ``broker``'s topic ``system.config`` (this node's
    subscribers only: every node publishes what it applied)."""

    def publish(change: dict[str, Any]) -> None:
        body = json.dumps(change, sort_keys=True).encode()
        message = Message(body=body, content_type="application/json", headers=core_headers())
        broker.publisher.publish_topic(TOPIC, [message])

    return publish


# ---- the console's page --------------------------------------------------------------------
def page(node: str, clustered: bool, version: int) -> str:
    """``GET /reload`` on the admin port: a form that posts a reload to
    ``/api/config/reload`` (with the cluster secret the operator types, in a cluster) and
    shows the answer (the console links to it)."""
    secret = (
        '<label>Cluster secret <input type="password" id="secret" autocomplete="off" '
        "required></label><br>"
        if clustered
        else ""
    )
    levels = "".join(f'<option value="{level}">{level}</option>' for level in LEVELS)
    limits = "".join(
        f'<label>{name} <input type="number" min="{least:g}" step="any" data-limit="{name}">'
        "</label><br>"
        for name, (_, least) in LIMITS.items()
    )
    where = "every node of the cluster and its frontends" if clustered else "this node"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>polymq {
        html.escape(node)
    }: reload</title><style>body{{font-family:system-ui,sans-serif;margin:2em}}
label{{display:inline-block;margin:.2em 0}}</style></head><body>
<h1>Reload the configuration</h1>
<p>Applied without a restart on {where}. This node applied configuration
<span id="version">{version}</span> last. <a href="/">console</a></p>
<form id="reload">{secret}
<label>Log level <select id="level"><option value="">(unchanged)</option>{levels}</select>
</label><br>
<label><input type="checkbox" id="users"> read the users files again</label><br>
<fieldset><legend>Limits (empty: unchanged)</legend>{limits}</fieldset>
<button type="submit">Reload</button></form>
<p id="answer" role="status"></p>
<script>
document.getElementById("reload").addEventListener("submit", async (event) => {{
  event.preventDefault();
  const change = {{}};
  const level = document.getElementById("level").value;
  if (level) change.log_level = level;
  if (document.getElementById("users").checked) change.users = true;
  const limits = {{}};
  for (const input of document.querySelectorAll("[data-limit]")) {{
    if (input.value !== "") limits[input.dataset.limit] = Number(input.value);
  }}
  if (Object.keys(limits).length) change.limits = limits;
  const headers = {{"Content-Type": "application/json"}};
  const secret = document.getElementById("secret");
  if (secret) headers.Authorization = "Bearer " + secret.value;
  const answer = document.getElementById("answer");
  answer.textContent = "sending...";
  try {{
    const response = await fetch("/api/config/reload",
      {{method: "POST", headers, body: JSON.stringify(change)}});
    const body = await response.json();
    if (!response.ok) {{
      answer.textContent = "refused: " + (body.detail || response.status);
    }} else if (body.error) {{
      answer.textContent = "configuration " + body.version + " sent; here: " + body.error;
    }} else {{
      answer.textContent = "configuration " + body.version + " applied";
      document.getElementById("version").textContent = body.version;
    }}
  }} catch (error) {{
    answer.textContent = "failed: " + error;
  }}
}});
</script></body></html>"""
