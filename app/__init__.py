"""mnemo serving application (FastAPI + ONNX Runtime; never imports torch)."""
