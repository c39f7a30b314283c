"""The task endpoints and GET /health called directly, skipping FastAPI's router and wrappers (a share of a small
request's time, benchmarks/asgi_overhead.py); FastAPI still serves and documents them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

RequestHandler = Callable[[Request], Awaitable[Response]]


class ServiceApp(FastAPI):
    """A FastAPI app that sends the requests of `direct_paths` ((method, path) pairs) to its own middlewares only,
    without the ones FastAPI adds around them; set `direct_paths` after adding the middlewares."""

    direct_paths: frozenset[tuple[str, str]] = frozenset()
    _own_middlewares: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) not in self.direct_paths or self.root_path:
            await super().__call__(scope, receive, send)
            return
        if self._own_middlewares is None:
            app = self.router
            for cls, args, kwargs in reversed(self.user_middleware):
                app = cls(app, *args, **kwargs)
            self._own_middlewares = app
        scope["app"] = self
        await self._own_middlewares(scope, receive, send)


class DirectRoutes:
    """Call the `routes` ((method, path) -> a function of the request) without FastAPI's router, their errors
    answered by the app's exception handlers; the scope's `route` is FastAPI's (the access line's template)."""

    def __init__(self, app: ASGIApp, fastapi: FastAPI, routes: Mapping[tuple[str, str], RequestHandler]) -> None:
        self.app = app
        self.fastapi = fastapi
        self.routes = routes
        self.documented: dict[tuple[str, str], APIRoute] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = (scope.get("method", ""), scope.get("path", ""))
        route = self.routes.get(key) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        if self.documented is None:
            routes = [route for route in self.fastapi.routes if isinstance(route, APIRoute)]
            self.documented = {(method, route.path): route for route in routes for method in route.methods}
        scope["endpoint"], scope["route"] = route, self.documented.get(key)
        request = Request(scope, receive)
        try:
            response = await route(request)
        except Exception as error:
            handlers = self.fastapi.exception_handlers  # the handler of its class or nearest base, as Starlette's
            handler = next((handlers[cls] for cls in type(error).__mro__ if cls in handlers), None)
            if handler is None:
                raise
            response = await handler(request, error)
        await response(scope, receive, send)
