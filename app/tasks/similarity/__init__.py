"""The similarity task (LSTM_RMC on SICK), its attributes the `Task` protocol's."""

from __future__ import annotations

from types import MappingProxyType

from fastapi import APIRouter

from app.runtime.model import GraphLayout
from app.tasks.similarity import rest, service
from app.tasks.similarity import tensors as tensors  # its Open Inference Protocol codec

name = "similarity"
tag = "similarity"
endpoints = rest.ENDPOINTS
routes = APIRouter()
layout = GraphLayout(
    ("emb_a", "emb_b"), MappingProxyType({"attn_a_fwd": 0, "attn_a_bwd": 0, "attn_b_fwd": 0, "attn_b_bwd": 0})
)
graphs = MappingProxyType({"encoder": GraphLayout(sequence_inputs=("emb",)), "head": GraphLayout()})
prepare, describe = service.prepare, service.describe
