"""What the worker and the cache service share (common/grpc_server.py), checked the same way for both."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase


def serving_with_reflection(addr: str, service: str) -> set[str]:
    """Assert grpc.health.v1 says SERVING for the server and for `service`, and that reflection lists
    `service` and the health service; return `service`'s method names, read through reflection."""
    with grpc.insecure_channel(addr) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", service):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {service, "grpc.health.v1.Health"} <= services
        proto_file = database.FindFileContainingSymbol(service)
        (described,) = [s for s in proto_file.service if f"{proto_file.package}.{s.name}" == service]
        return {m.name for m in described.method}
