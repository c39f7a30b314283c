"""Transports: protocol adapters over the task services (REST operations; task routers live in their task)."""
