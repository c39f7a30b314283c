"""The similarity task (LSTM_RMC on SICK), its attributes the `Task` protocol's."""

from __future__ import annotations

from fastapi import APIRouter

from app.tasks.similarity import rest, service
from app.tasks.similarity import tensors as tensors  # its Open Inference Protocol codec

name = "similarity"
tag = "similarity"
endpoints = rest.ENDPOINTS
routes = APIRouter()
graphs = ("encoder", "head")
prepare, describe = service.prepare, service.describe
