"""The small page served at ``/`` by the WebSocket listener: subscribe and publish from a
browser with @stomp/stompjs. The library is served from this frontend at
``/static/stomp.umd.min.js`` (installed from npm by the Makefile; never a CDN)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

__all__ = ["STOMPJS", "add_routes", "stompjs_path"]

STATIC = Path(__file__).resolve().parent / "static"
# services/stomp/web/node_modules/... next to the package in the source tree (make install)
STOMPJS = (
    Path(__file__).resolve().parents[1]
    / "web"
    / "node_modules"
    / "@stomp"
    / "stompjs"
    / "bundles"
    / "stomp.umd.min.js"
)
PATH_KEY = web.AppKey("stompjs_path", Path)


def stompjs_path(configured: str) -> Path:
    return Path(configured) if configured else STOMPJS


async def index(request: web.Request) -> web.StreamResponse:
    page = STATIC / "index.html"
    if not page.is_file():  # pragma: no cover - a broken install
        return web.Response(status=404, text="the STOMP page is not installed\n")
    return web.FileResponse(page, headers={"Content-Type": "text/html; charset=utf-8"})


async def stompjs(request: web.Request) -> web.StreamResponse:
    path = request.app[PATH_KEY]
    if not path.is_file():
        return web.Response(
            status=404,
            text=(
                f"stomp.umd.min.js is not installed (looked for {path}): run `make install` "
                "(npm ci in services/stomp/web) or set POLYMQ_STOMP_STOMPJS to its path\n"
            ),
        )
    return web.FileResponse(
        path,
        headers={
            "Content-Type": "application/javascript; charset=utf-8",
            "Cache-Control": "max-age=3600",
        },
    )


def add_routes(app: web.Application, configured: str) -> None:
    app[PATH_KEY] = stompjs_path(configured)
    app.router.add_get("/", index)
    app.router.add_get("/static/stomp.umd.min.js", stompjs)
