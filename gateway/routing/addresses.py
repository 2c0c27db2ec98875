"""WORKER_ADDR: which workers serve which model, and their addresses, re-resolved while running.

Entries are comma-separated, each `[model=]target`. A target is `host:port`, `dns:///host:port` (the
form compose and Kubernetes use), `ipv4:ip:port` or `[ipv6]:port`; a DNS name becomes one address per
record it resolves to (a scaled compose service, a headless Service), so each replica gets its own
channel and routing sees every one. `model=` pins the model its workers must serve; without it, the
worker's own report says which model it serves.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from dataclasses import dataclass

log = logging.getLogger(__name__)

SCHEMES = ("dns:///", "dns:", "ipv4:", "ipv6:")


@dataclass(frozen=True)
class WorkerTarget:
    """One WORKER_ADDR entry: `host` may be a name that resolves to several workers."""

    model: str | None
    host: str
    port: int

    @property
    def literal(self) -> str | None:
        """The address itself when the host is an IP address (nothing to resolve), else None."""
        try:
            ip = ipaddress.ip_address(self.host)
        except ValueError:
            return None
        return f"[{ip}]:{self.port}" if ip.version == 6 else f"{ip}:{self.port}"


def parse_entry(entry: str) -> WorkerTarget:
    model, sep, target = entry.strip().partition("=")
    if not sep:
        model, target = "", model
    target = target.strip()
    for scheme in SCHEMES:
        if target.startswith(scheme):
            target = target[len(scheme) :]
            break
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"WORKER_ADDR entry {entry.strip()!r} is not [model=]host:port")
    return WorkerTarget(model.strip() or None, host.strip("[]"), int(port))


def parse_worker_addr(value: str | list[str]) -> list[WorkerTarget]:
    entries = value if isinstance(value, list) else [value]
    targets = [parse_entry(e) for entry in entries for e in entry.split(",") if e.strip()]
    if not targets:
        raise ValueError("WORKER_ADDR names no worker")
    return targets


async def resolve(target: WorkerTarget) -> list[str]:
    """Every address the target names (IPv4 ones when there are any); raises OSError when DNS fails."""
    if target.literal is not None:
        return [target.literal]
    infos = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    v4 = sorted({info[4][0] for info in infos if info[0] == socket.AF_INET})
    if v4:
        return [f"{ip}:{target.port}" for ip in v4]
    return sorted({f"[{info[4][0]}]:{target.port}" for info in infos if info[0] == socket.AF_INET6})


async def resolve_all(
    targets: list[WorkerTarget], previous: dict[WorkerTarget, list[str]]
) -> dict[WorkerTarget, list[str]]:
    """Each target's addresses now; a name that fails to resolve keeps the addresses it had."""
    found: dict[WorkerTarget, list[str]] = {}
    for target in targets:
        try:
            found[target] = await resolve(target)
        except OSError as exc:
            log.warning("could not resolve worker %s: %s; keeping its last addresses", target.host, exc)
            found[target] = previous.get(target, [])
    return found
