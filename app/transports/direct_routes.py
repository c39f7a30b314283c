"""Direct dispatch of the routes that read their own request, before FastAPI's router.

FastAPI's routing (matching the path against every included router, then its request and response
wrappers and inner middlewares) costs about 0.13 ms a request on a 2-core machine: 5% of a /similarity
run at batch 1. The task routes take nothing from FastAPI but the `Request`: they read and validate their
own bodies (`app.transports.http.read_body`). This layer calls such an endpoint directly for its one method
and exact path, and turns its errors into responses with the app's exception handlers, as FastAPI would.
Every other request, and any other method on those paths, goes to FastAPI unchanged; FastAPI also
documents these routes in OpenAPI.

`ServiceApp` goes one step further for the same requests: it hands them straight to the app's own
middlewares (request id and access line, access control, drain gate, body limit, error catcher), without
the middlewares FastAPI puts around those (its server-error handler, OpenTelemetry hook and body limit: the
app's own error catcher and body limit do those jobs here): about 15 us a request.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterable, Iterator, Mapping

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send


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


def takes_only_the_request(route: APIRoute) -> bool:
    """True for a one-method route without path parameters whose endpoint is a coroutine function taking only
    the Request and returning a Response."""
    dependant = route.dependant
    params = (
        dependant.path_params,
        dependant.query_params,
        dependant.header_params,
        dependant.cookie_params,
        dependant.body_params,
        dependant.dependencies,
        route.dependencies,
    )
    return (
        len(route.methods) == 1
        and not route.param_convertors
        and dependant.request_param_name is not None
        and not any(params)
        and inspect.iscoroutinefunction(route.endpoint)
        and _returns_a_response(route.endpoint)
    )


def _returns_a_response(endpoint) -> bool:
    returned = typing.get_type_hints(endpoint).get("return")
    return isinstance(returned, type) and issubclass(returned, Response)


def direct_routes(routers: Iterable[APIRouter]) -> dict[tuple[str, str], APIRoute]:
    """(method, path) -> route, for every route of these routers that `takes_only_the_request`."""
    return {
        (next(iter(route.methods)), route.path): route
        for router in routers
        for route in _api_routes(router)
        if takes_only_the_request(route)
    }


def _api_routes(router: APIRouter) -> Iterator[APIRoute]:
    """The router's routes, and those of the routers it includes without a prefix or dependencies (recent
    FastAPI keeps an included router as one entry; older versions copy its routes in)."""
    for route in router.routes:
        if isinstance(route, APIRoute):
            yield route
        context = getattr(route, "include_context", None)
        if context is not None and not context.prefix and not context.dependencies:
            yield from _api_routes(route.original_router)


class DirectRoutes:
    """Call the endpoints of `direct_routes(routers)` without FastAPI's router (see the module docstring).

    The routers must be included in `fastapi` at the root: without a prefix or dependencies.
    """

    def __init__(self, app: ASGIApp, fastapi: FastAPI, routers: Iterable[APIRouter]) -> None:
        self.app = app
        self.fastapi = fastapi
        self.routes: Mapping[tuple[str, str], APIRoute] = direct_routes(routers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get((scope.get("method", ""), scope.get("path", ""))) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["route"], scope["endpoint"] = route, route.endpoint
        request = Request(scope, receive)
        try:
            response = await route.endpoint(request)
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
