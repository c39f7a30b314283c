"""PyTorch model definitions, data loaders and training commands (needs the `train` extra)."""
