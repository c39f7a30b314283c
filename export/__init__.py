"""ONNX export, parity checks and the artifact manifest (needs the `train` extra)."""
