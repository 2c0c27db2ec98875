"""Code shared by the gateway, the worker and the cache service."""
