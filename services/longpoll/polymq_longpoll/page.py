"""The demo page at ``/`` and the JavaScript client at ``/polymq-longpoll.js``: plain files
in ``static/``, served as they are (no build step, nothing from a CDN)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

__all__ = ["STATIC", "add_routes"]

STATIC = Path(__file__).resolve().parent / "static"
_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/polymq-longpoll.js": ("polymq-longpoll.js", "text/javascript; charset=utf-8"),
}


async def _serve(request: web.Request) -> web.StreamResponse:
    name, content_type = _FILES[request.path]
    path = STATIC / name
    if not path.is_file():  # pragma: no cover - a broken install
        return web.Response(status=404, text=f"{name} is not installed\n")
    return web.FileResponse(
        path, headers={"Content-Type": content_type, "Cache-Control": "no-cache"}
    )


def add_routes(app: web.Application) -> None:
    for route in _FILES:
        app.router.add_get(route, _serve)
