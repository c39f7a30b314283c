"""Request and response models of the HTTP API (field names as in ../shared/spec/API.md)."""
