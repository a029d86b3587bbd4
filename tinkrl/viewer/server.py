"""`tinkrl view`'s web server: one page and a small JSON API over run and eval directories.

Everything is served from this machine (the page, its script, the vendored uPlot), so the viewer works
offline. The page polls the API, so a run that is still training shows its new steps without a reload;
files are re-read only when their size or modification time changed.

It serves the run files it was given and nothing else: a file of a run that resolves outside its run
directory (a symlink out, say) is not read, and a page needs `--api-key` where one was set (sent as
`Authorization: Bearer KEY`, or opened once as `/?key=KEY`, which keeps it in a cookie).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aiohttp import web

from tinkrl.access import key_matches, request_key
from tinkrl.traces.runs import (
    episode_steps,
    eval_episodes,
    eval_results,
    find_dirs,
    is_run_dir,
    run_info,
    step_episodes,
)
from tinkrl.tracking import read_jsonl

STATIC = Path(__file__).parent / "static"
COOKIE = "tinkrl_view_key"
# What the API reads of a run or eval directory, relative to it.
RUN_FILES = ("run.json", "metrics.jsonl", "warm_start.jsonl", "results.json", "results.jsonl", "episodes")


def escapes(directory: Path, *relative: str) -> bool:
    """Whether any `directory / name` resolves to a place outside `directory` (a symlink out of it)."""
    root = directory.resolve()
    return any(not (directory / name).resolve().is_relative_to(root) for name in relative)


class _FileCache:
    """Parsed files, re-read when their (size, mtime) changes."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Path, str], tuple[tuple[int, int], Any]] = {}

    def get(self, path: Path, kind: str, load: Callable[[Path], Any]) -> Any:
        """`load(path)`, or what it gave last time if the file has not changed since."""
        try:
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            return load(path)
        hit = self._cache.get((path, kind))
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = load(path)
        self._cache[(path, kind)] = (stamp, value)
        return value


class Viewer:
    """The directories given to `tinkrl view` (each a run dir, an eval dir, or a folder of them, scanned
    again on every listing so new runs appear) and the API handlers over them."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.cache = _FileCache()

    def sources(self) -> list[Path]:
        """The run and eval directories found now, but those with a file that leads out of them."""
        return [d for d in find_dirs(self.paths) if not escapes(d, *RUN_FILES)]

    def _source(self, request: web.Request) -> Path:
        try:
            return self.sources()[int(request.query["source"])]
        except (KeyError, ValueError, IndexError) as e:
            raise web.HTTPNotFound(text="unknown source") from e

    async def list_sources(self, request: web.Request) -> web.Response:
        out = []
        for i, d in enumerate(self.sources()):
            if is_run_dir(d):
                out.append({"id": i, "kind": "run", "path": str(d), **run_info(d)})
            else:
                results = self.cache.get(d / "results.json", "results", lambda _, d=d: eval_results(d))
                out.append({"id": i, "kind": "eval", "path": str(d), "name": d.name, "model": results.get("model")})
        return web.json_response(out)

    async def metrics(self, request: web.Request) -> web.Response:
        d = self._source(request)
        rows = self.cache.get(d / "metrics.jsonl", "rows", read_jsonl)
        warm = self.cache.get(d / "warm_start.jsonl", "rows", read_jsonl)
        return web.json_response({"rows": rows, "warm_start": warm})

    async def steps(self, request: web.Request) -> web.Response:
        return web.json_response({"steps": episode_steps(self._source(request))})

    async def episodes(self, request: web.Request) -> web.Response:
        d = self._source(request)
        try:
            step = int(request.query["step"])
        except (KeyError, ValueError) as e:
            raise web.HTTPBadRequest(text="step must be an integer") from e
        name = f"episodes/step_{step:06d}.jsonl"
        path = d / name
        if escapes(d, name):
            raise web.HTTPNotFound(text="unknown step")
        episodes = self.cache.get(path, "episodes", lambda _: [asdict(e) for e in step_episodes(d, step)])
        return web.json_response({"step": step, "episodes": episodes})

    async def evaluation(self, request: web.Request) -> web.Response:
        d = self._source(request)
        results = self.cache.get(d / "results.json", "results", lambda _: eval_results(d))
        trials = self.cache.get(d / "results.jsonl", "trials", lambda _: [asdict(e) for e in eval_episodes(d)])
        return web.json_response({"results": results, "trials": trials})


def _no_cache(handler):
    async def wrapped(request: web.Request) -> web.StreamResponse:
        response = await handler(request)
        response.headers["Cache-Control"] = "no-store"
        return response

    return wrapped


def _key_check(api_key: str):
    """A middleware that lets in requests with `api_key` (header or cookie); `/?key=KEY` sets the cookie."""

    @web.middleware
    async def check(request: web.Request, handler) -> web.StreamResponse:
        if key_matches(request.query.get("key"), api_key):
            response = web.HTTPFound("/")
            response.set_cookie(COOKIE, api_key, httponly=True, samesite="Strict")
            raise response
        if key_matches(request_key(request.headers) or request.cookies.get(COOKIE), api_key):
            return await handler(request)
        return web.Response(status=401, text="tinkrl view: this viewer needs its key: open /?key=KEY once\n")

    return check


def make_app(paths: list[Path], api_key: str | None = None) -> web.Application:
    """The viewer's aiohttp application over `paths`; with `api_key`, only for requests that carry it."""
    viewer = Viewer(paths)
    app = web.Application(middlewares=[] if api_key is None else [_key_check(api_key)])

    async def index(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    app.router.add_get("/", index)
    app.router.add_get("/api/sources", _no_cache(viewer.list_sources))
    app.router.add_get("/api/metrics", _no_cache(viewer.metrics))
    app.router.add_get("/api/steps", _no_cache(viewer.steps))
    app.router.add_get("/api/episodes", _no_cache(viewer.episodes))
    app.router.add_get("/api/eval", _no_cache(viewer.evaluation))
    app.router.add_static("/static/", STATIC)
    return app
