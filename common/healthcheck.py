"""Container health probe: exit 0 when a service answers healthy, 1 otherwise.

`python -m common.healthcheck grpc 127.0.0.1:50051` asks grpc.health.v1 (the overall status, or
`--service NAME`); `python -m common.healthcheck http http://127.0.0.1:8000/health` wants a 2xx.
A Python probe needs nothing beyond the image's own packages (no grpc_health_probe binary, no curl).
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check_grpc(target: str, service: str, timeout_s: float) -> tuple[bool, str]:
    """True when the health service reports SERVING for `service` ("" is the server as a whole)."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, status


def check_http(url: str, timeout_s: float) -> tuple[bool, str]:
    """True on a 2xx answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= resp.status < 300, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return False, str(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="kind", required=True)
    grpc_parser = sub.add_parser("grpc", help="grpc.health.v1 Check")
    grpc_parser.add_argument("target", help="host:port")
    grpc_parser.add_argument("--service", default="", help="service name; empty: the whole server")
    http_parser = sub.add_parser("http", help="HTTP GET expecting 2xx")
    http_parser.add_argument("url")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    args = parser.parse_args(argv)
    if args.kind == "grpc":
        ok, detail = check_grpc(args.target, args.service, args.timeout)
    else:
        ok, detail = check_http(args.url, args.timeout)
    print(("healthy: " if ok else "unhealthy: ") + detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
