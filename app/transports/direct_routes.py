"""Direct dispatch of the task endpoints (app/transports/rest.py), before FastAPI's router.

The task endpoints take nothing from FastAPI but the `Request`: they read and validate their own bodies. FastAPI's
routing and the wrappers around each route cost a share of a small request's time that the service's latency
budget does not have (benchmarks/asgi_overhead.py measures it). `DirectRoutes` calls such an endpoint for its
one method and exact path and turns its errors into responses with the app's exception handlers, as FastAPI
would; every other request goes to FastAPI, which also documents these routes in OpenAPI. `ServiceApp` hands the
same requests straight to the app's own middleware, without the ones FastAPI adds around it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

RequestHandler = Callable[[Request], Awaitable[Response]]


class ServiceApp(FastAPI):
    """A FastAPI app that sends the requests of `direct_paths` ((method, path) pairs, see `direct_routes`) to
    its own middlewares only (see the module docstring); set `direct_paths` after adding the middlewares."""

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
    """Call the `routes` ((method, path) -> a function of the request) without FastAPI's router (see the module
    docstring); FastAPI must serve the same functions at the same paths, which documents them."""

    def __init__(self, app: ASGIApp, fastapi: FastAPI, routes: Mapping[tuple[str, str], RequestHandler]) -> None:
        self.app = app
        self.fastapi = fastapi
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get((scope.get("method", ""), scope.get("path", ""))) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["endpoint"] = route
        request = Request(scope, receive)
        try:
            response = await route(request)
        except Exception as error:
            handler = self._handler_for(error)
            if handler is None:
                raise
            response = await handler(request, error)
        await response(scope, receive, send)

    def _handler_for(self, error: Exception):
        """The app's exception handler for this error's class or its nearest base, as Starlette looks it up."""
        handlers = self.fastapi.exception_handlers
        return next((handlers[cls] for cls in type(error).__mro__ if cls in handlers), None)
