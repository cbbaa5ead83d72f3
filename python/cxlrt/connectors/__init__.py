"""Adapters that plug the cxlrt KV store into inference servers as their
KV-cache tier (docs/python.md, "Connectors"). Each module imports its
framework, so import only the one you use."""
