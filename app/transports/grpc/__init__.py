"""The Open Inference Protocol over gRPC (`inference.GRPCInferenceService`), over the same code as REST v2."""

from app.transports.grpc.server import serve_grpc

__all__ = ["serve_grpc"]
