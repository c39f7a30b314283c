"""The frame: settings, providers, the task-agnostic registry, errors, middleware, metrics, logging."""
