"""The Open Inference Protocol (KServe v2) over REST: `router`, included by app/main.py."""

from app.transports.oip.routes import router

__all__ = ["router"]
