"""Routing settings as the pool takes them (GatewaySettings.routing_config() fills them from the env)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.router import Policy


@dataclass(frozen=True)
class RoutingConfig:
    policy: Policy = "cache_aware"
    balance: float = 1.25  # (1 + eps): a worker above balance x the mean load is passed over...
    slack: int = 4  # ...unless it holds at most this many more than the least-loaded worker...
    hot_key_requests: int = 3  # ...and the key has fewer than this many calls open here (0: never hot)
    hot_share: float = 0.75  # a key with this part of a worker's fair share of the requests is hot (0: never)
    key_balance: float = 1.25  # a worker owns at most this over the mean of the recent keys (0: no bound)
    half_life_s: float = 30.0  # of the fading counts: a key's share, a worker's recent prompt tokens
    prefix_chars: int = 1024
    session_affinity: bool = False
    stale_after_s: float = 3.0
    resolve_interval_s: float = 5.0
    stream_stall_s: float = 10.0
