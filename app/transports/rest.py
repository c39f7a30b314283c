"""The tasks' JSON APIs over HTTP: per `Endpoint`, a route that reads the body, picks the model (404/503), admits the
request in its batcher (429) and awaits the answer within the deadline (504) unless the client leaves (499)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.core.responses import JsonResponse
from app.runtime.model import Endpoint, Task
from app.transports.deadline import within_deadline
from app.transports.http import json_body, read_body


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


def endpoint_route(task_name: str, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The route function of one endpoint (it reads the body itself)."""

    async def route(request: Request) -> JsonResponse:
        body = await read_body(request, endpoint.request, task_name if endpoint.reserve else None)
        model = request.app.state.registry.get(body.model, task_name)
        with endpoint.admit(model, body):
            answer = endpoint.answer(model, body, request.app.state.drain.alone())
            return JsonResponse(await within_deadline(answer, request.app.state, model.name, receive=request.receive))

    return route
