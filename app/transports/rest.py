"""The tasks' JSON APIs over HTTP: per `Endpoint`, a route that reads the body, picks the model (404/503), admits
the request in its batcher (429) and awaits the answer within the deadline (504) unless the client leaves (499).
FastAPI serves and documents them, but they are called directly, skipping its router and wrappers (a share of a small
request's time, benchmarks/asgi_overhead.py): `ServiceApp`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.responses import JsonResponse
from app.runtime.model import Endpoint, Task
from app.transports.http import complete, json_body, read_body, registry

Handler = Callable[[Request], Awaitable[Response]]  # a route that takes only the request


def task_router(tasks: Iterable[Task]) -> APIRouter:
    """The routes of every task's endpoints, and the tasks' other routes."""
    router = APIRouter()
    for task in tasks:
        for endpoint in task.endpoints:
            router.add_api_route(
                endpoint.path,
                endpoint_route(task.name, endpoint),
                methods=["POST"],
                name=endpoint.name,
                operation_id=endpoint.operation_id,
                description=endpoint.description,
                response_model=endpoint.response,
                openapi_extra=json_body(endpoint.request),
                tags=[task.tag],
            )
        router.include_router(task.routes, tags=[task.tag])
    return router


def direct_routes(tasks: Iterable[Task]) -> dict[tuple[str, str], Handler]:
    """(method, path) -> route function of every task endpoint, for `ServiceApp.direct_routes`."""
    return {("POST", e.path): endpoint_route(task.name, e) for task in tasks for e in task.endpoints}


def endpoint_route(task_name: str, endpoint: Endpoint) -> Handler:
    """The route function of one endpoint (it reads the body itself)."""

    async def route(request: Request) -> JsonResponse:
        body = await read_body(request, endpoint.request, task_name if endpoint.reserve else None)
        model = registry(request).get(body.model, task_name)
        admission = endpoint.admit(model, body)
        with admission.batcher.admit(admission.rows, cells=admission.cells):
            answer = endpoint.answer(model, body, request.app.state.drain.alone())
            return JsonResponse(await complete(request, answer, model.name))

    return route


class ServiceApp(FastAPI):
    """A FastAPI app that calls `direct_routes` ((method, path) -> a function of the request) for the requests of
    `direct_paths` inside its own middlewares only, skipping FastAPI's router and the middlewares it adds; their
    errors are answered by the app's exception handlers."""

    direct_routes: Mapping[tuple[str, str], Handler] = {}
    direct_paths: frozenset[tuple[str, str]] = frozenset()  # with the HEADs the middlewares answer as GETs
    _own_middlewares: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) not in self.direct_paths or self.root_path:
            await super().__call__(scope, receive, send)
            return
        if self._own_middlewares is None:
            app = self.direct
            for cls, args, kwargs in reversed(self.user_middleware):
                app = cls(app, *args, **kwargs)
            self._own_middlewares = app
        scope["app"] = self
        await self._own_middlewares(scope, receive, send)

    async def direct(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Call the direct route of the request (the middlewares may have turned a HEAD into its GET)."""
        request = Request(scope, receive)
        try:
            response = await self.direct_routes[scope["method"], scope["path"]](request)
        except Exception as error:
            handlers = self.exception_handlers  # the handler of its class or nearest base, as Starlette's
            handler = next((handlers[cls] for cls in type(error).__mro__ if cls in handlers), None)
            if handler is None:
                raise
            response = await handler(request, error)
        await response(scope, receive, send)
