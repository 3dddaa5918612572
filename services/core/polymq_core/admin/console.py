"""The operator's console at ``/`` on the admin port: a small single-page app
(``static/console.html``, ``.js``, ``.css``) that reads only the admin JSON API
(docs/admin-api.md) with ``fetch`` and ``EventSource``. Its charts are uPlot's, installed
from npm by the Makefile (``services/core/web``) and served from here at
``/static/uPlot.iife.min.js`` and ``/static/uPlot.min.css``: never from a CDN."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

__all__ = ["CHART", "CHART_FILES", "add_routes", "chart_dir"]

STATIC = Path(__file__).resolve().parent / "static"
# services/core/web/node_modules/uplot/dist next to the package in the source tree
CHART = Path(__file__).resolve().parents[2] / "web" / "node_modules" / "uplot" / "dist"
CHART_FILES = ("uPlot.iife.min.js", "uPlot.min.css")
_OWN_FILES = ("console.js", "console.css")
_TYPES = {".js": "application/javascript", ".css": "text/css", ".html": "text/html"}
CHART_DIR = web.AppKey("chart_dir", Path)


def chart_dir(configured: str) -> Path:
    return Path(configured) if configured else CHART


def _file(path: Path, cache: str) -> web.StreamResponse:
    if not path.is_file():
        return web.Response(
            status=404,
            text=(
                f"{path.name} is not installed (looked for {path}): run `make install` "
                "(npm ci in services/core/web) or set POLYMQ_CONSOLE_CHART to uPlot's dist/\n"
            ),
        )
    kind = _TYPES[path.suffix]
    return web.FileResponse(
        path, headers={"Content-Type": f"{kind}; charset=utf-8", "Cache-Control": cache}
    )


async def page(request: web.Request) -> web.StreamResponse:
    return _file(STATIC / "console.html", "no-cache")


async def asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name in _OWN_FILES:
        return _file(STATIC / name, "no-cache")
    if name in CHART_FILES:
        return _file(request.app[CHART_DIR] / name, "max-age=3600")
    raise web.HTTPNotFound()


def add_routes(app: web.Application, configured: str) -> None:
    app[CHART_DIR] = chart_dir(configured)
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", asset)
