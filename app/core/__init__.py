"""The lowest layer: settings, errors, metrics, logging and the manifest."""
