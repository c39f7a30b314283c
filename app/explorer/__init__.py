"""The browser explorer: a single page served from the package's own static files (see `router`)."""
