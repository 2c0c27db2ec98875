"""Real processes for the cache tests: redis-server and `python -m cache_service` on free loopback ports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.net import OWN_ENV_PREFIXES, REDIS_SERVER, ROOT, free_port, grpc_serving

START_TIMEOUT_S = 180.0


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready: Callable[[], bool]
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> Proc:
        env = {k: v for k, v in os.environ.items() if not k.startswith(OWN_ENV_PREFIXES)}
        env.update(self.env, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.ready():
                    return self
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {START_TIMEOUT_S:g} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_redis(log_dir: Path) -> tuple[Proc, str]:
    import redis

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    argv = [
        str(REDIS_SERVER),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(log_dir),
    ]
    proc = Proc(
        f"redis-{port}",
        argv,
        {},
        log_dir / f"redis-{port}.log",
        lambda: bool(redis.Redis.from_url(url, socket_timeout=1).ping()),
    )
    return proc.start(), url


@dataclass
class CacheService:
    proc: Proc
    addr: str
    metrics_url: str


def start_cache_service(log_dir: Path, redis_url: str, name: str = "cache", **env: str) -> CacheService:
    port, metrics_port = free_port(), free_port()
    addr = f"127.0.0.1:{port}"
    full_env = {
        "CACHE_PORT": str(port),
        "CACHE_METRICS_PORT": str(metrics_port),
        "REDIS_URL": redis_url,
    } | env
    proc = Proc(
        name,
        [sys.executable, "-m", "cache_service"],
        full_env,
        log_dir / f"{name}-{port}.log",
        lambda: grpc_serving(addr),
    )
    proc.start()
    return CacheService(proc, addr, f"http://127.0.0.1:{metrics_port}/metrics")
