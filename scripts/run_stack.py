"""`make run`: Redis, the semantic cache service, WORKERS workers (per model of WORKER_MODELS) and the
gateway, each its own process.

Every setting is the service's own environment variable, passed through unchanged. Each service is
waited on until healthy; if one dies later the others keep running (the gateway answers 503 while no
worker is up, and serves without the cache while the cache is away) and the dead one is restarted,
as compose's restart policy does: after RESTART_BACKOFF_S, doubling on each exit in a row up to
RESTART_BACKOFF_MAX_S, back to the start once a run lasted RESTART_STABLE_AFTER_S. Each exit and
restart is logged. Ctrl-C or SIGTERM stops all (each service drains first; see docs/OPERATIONS.md).
Several workers share this machine's cores: each is given its own (WORKER_CPUS) unless the operator set
WORKER_CPUS or WORKER_NUM_THREADS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.cpus import format_cpu_list, physical_cores, split_cpus, usable_cpus
from scripts.launch import (
    ROOT,
    STOP_TIMEOUT_S,
    StartError,
    grpc_serving,
    http_ok,
    port_in_use,
    stop_process,
    wait_ready,
)

RUN_DIR = ROOT / ".run"
PORT_STRIDE = 10  # worker i listens on WORKER_PORT + 10 i (metrics: WORKER_METRICS_PORT + 10 i)
START_TIMEOUT_S = 300.0
WATCH_PERIOD_S = 0.2


class StackSettings(BaseSettings):
    """The few settings the launcher itself reads; everything else goes to the services untouched."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore")

    redis_url: str | None = None  # set: use that Redis; unset: start .venv/bin/redis-server
    gateway_redis_url: str | None = None  # stored /v1/responses; unset: the same Redis as the cache
    workers: int = Field(default=1, ge=1)  # worker processes per model
    # Several models behind the one gateway: comma-separated WORKER_MODEL paths, WORKERS workers for each,
    # served under the folder's name (WORKER_ADDR becomes `name=addr,...`). Empty: WORKER_MODEL's one model.
    worker_models: str = ""
    worker_host: str = "127.0.0.1"
    worker_port: int = 50051
    worker_metrics_port: int = 9101
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8000
    cache_host: str = "127.0.0.1"
    cache_port: int = 50052
    cache_metrics_port: int = 9102
    cache_enabled: bool = True
    restart_backoff_s: float = Field(default=1.0, gt=0)
    restart_backoff_max_s: float = Field(default=30.0, gt=0)
    restart_stable_after_s: float = Field(default=60.0, gt=0)


@dataclass(frozen=True)
class Backoff:
    """Delay before restarting a child that exited, after `failures_in_a_row` exits."""

    initial_s: float = 1.0
    max_s: float = 30.0
    stable_after_s: float = 60.0  # a run at least this long starts the doubling over

    def delay(self, failures_in_a_row: int) -> float:
        return min(self.max_s, self.initial_s * 2 ** max(failures_in_a_row - 1, 0))


@dataclass
class Child:
    """One supervised process; its output is copied to ours, each line prefixed with its name."""

    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures_in_a_row: int = 0
    restart_at: float | None = None  # set while a restart is pending

    def start(self) -> None:
        self.started_at = time.monotonic()
        env = os.environ | self.env | {"PYTHONUNBUFFERED": "1"}
        # Own session: Ctrl-C reaches only the launcher, which then stops children in order.
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            sys.stdout.write(f"[{self.name}] {raw.decode(errors='replace')}")
            sys.stdout.flush()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if not self.alive:
            return
        started = time.monotonic()
        stop_process(self.proc, STOP_TIMEOUT_S)
        if time.monotonic() - started >= STOP_TIMEOUT_S:
            say(f"{self.name} did not stop in {STOP_TIMEOUT_S:.0f}s; killed it")


def say(message: str) -> None:
    print(f"[run] {message}", flush=True)


def wait_healthy(child: Child, check: Callable[[], bool], stopping: threading.Event) -> bool:
    """scripts/launch.py's wait; a child that is not healthy in time is left running (and said so)."""
    assert child.proc is not None
    try:
        wait_ready(child.proc, check, child.name, START_TIMEOUT_S, stopping=stopping, poll_s=0.3)
        return True
    except StartError as exc:
        if not stopping.is_set():
            say(str(exc).strip() + ("; leaving it running" if child.alive else ""))
        return False


def worker_models(s: StackSettings) -> list[str | None]:
    """The model of each worker to start: WORKERS of each WORKER_MODELS entry (None: WORKER_MODEL's)."""
    models = [m.strip() for m in s.worker_models.split(",") if m.strip()] or [None]
    return [model for model in models for _ in range(s.workers)]


def worker_cpus(workers: int, environ: Mapping[str, str]) -> list[str]:
    """Each worker's WORKER_CPUS when several run here and the operator set neither WORKER_CPUS nor
    WORKER_NUM_THREADS: the usable CPUs split into whole cores (common/cpus.py says why). Empty: leave the
    workers to their defaults."""
    if workers < 2 or environ.get("WORKER_CPUS") or environ.get("WORKER_NUM_THREADS"):
        return []
    return [format_cpu_list(part) for part in split_cpus(usable_cpus(), workers)]


def oversubscription_warning(workers: int, environ: Mapping[str, str], cores: int) -> str:
    """A warning when the operator's WORKER_NUM_THREADS makes the workers' threads outnumber the cores
    they share (no WORKER_CPUS to keep them apart); "" otherwise."""
    threads = environ.get("WORKER_NUM_THREADS", "")
    if workers < 2 or environ.get("WORKER_CPUS") or not threads.isdigit():
        return ""
    if workers * int(threads) <= cores:
        return ""
    return (
        f"{workers} workers x WORKER_NUM_THREADS={threads} threads share {cores} cores: their threads wait "
        "for each other at every step (many times slower); unset WORKER_NUM_THREADS and make run gives each "
        "worker its own cores"
    )


class Stack:
    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.backoff = Backoff(
            settings.restart_backoff_s, settings.restart_backoff_max_s, settings.restart_stable_after_s
        )
        self.children: list[Child] = []
        self.stopping = threading.Event()
        self.lines: list[str] = []

    def python(self, name: str, module: str, env: dict[str, str]) -> Child:
        child = Child(name, [sys.executable, "-m", module], env)
        self.children.append(child)
        child.start()
        return child

    def redis_url(self) -> str:
        if self.settings.redis_url:
            self.lines.append(f"redis          {self.settings.redis_url} (REDIS_URL)")
            return self.settings.redis_url
        url = "redis://127.0.0.1:6379/0"
        if port_in_use("127.0.0.1", 6379):
            say("127.0.0.1:6379 is already in use; using the Redis there")
            self.lines.append(f"redis          {url} (already running)")
            return url
        data_dir = RUN_DIR / "redis"
        data_dir.mkdir(parents=True, exist_ok=True)
        args = ["--bind", "127.0.0.1", "--port", "6379", "--dir", str(data_dir), "--save", "300 1"]
        child = Child("redis", [str(ROOT / ".venv/bin/redis-server"), *args])
        self.children.append(child)
        child.start()
        wait_healthy(child, lambda: port_in_use("127.0.0.1", 6379), self.stopping)
        self.lines.append(f"redis          {url} (data in {data_dir.relative_to(ROOT)})")
        return url

    def up(self) -> None:
        s = self.settings
        pending: list[tuple[Child, Callable[[], bool], str]] = []
        cache_addr = f"{s.cache_host}:{s.cache_port}"
        redis_url = self.redis_url() if s.cache_enabled or s.gateway_redis_url is None else None
        if s.cache_enabled:
            cache = self.python("cache", "cache_service", {"REDIS_URL": redis_url or ""})
            line = f"cache service  grpc {cache_addr}, metrics http://{s.cache_host}:{s.cache_metrics_port}/metrics"
            pending.append((cache, lambda: grpc_serving(cache_addr), line))
        worker_addrs = []
        models = worker_models(s)
        cpus = worker_cpus(len(models), os.environ)
        warning = oversubscription_warning(len(models), os.environ, physical_cores(usable_cpus()))
        if warning:
            say(warning)
        for i, model in enumerate(models):
            port, metrics_port = s.worker_port + PORT_STRIDE * i, s.worker_metrics_port + PORT_STRIDE * i
            addr = f"{s.worker_host}:{port}"
            env = {"WORKER_PORT": str(port), "WORKER_METRICS_PORT": str(metrics_port)}
            if cpus:
                env["WORKER_CPUS"] = cpus[i]
            if model is not None:
                env |= {"WORKER_MODEL": model, "WORKER_SERVED_MODEL_NAME": PurePath(model).name}
            worker = self.python(f"worker-{i}", "worker", env)
            line = f"worker-{i}       grpc {addr}, metrics http://{s.worker_host}:{metrics_port}/metrics"
            line += f", CPUs {cpus[i]}" if cpus else ""
            pending.append((worker, lambda addr=addr: grpc_serving(addr), line))
            worker_addrs.append(addr if model is None else f"{PurePath(model).name}={addr}")
        for child, check, line in pending:
            if wait_healthy(child, check, self.stopping):
                self.lines.append(line)
        if self.stopping.is_set():
            return
        gateway_env = {"WORKER_ADDR": ",".join(worker_addrs), "CACHE_ADDR": cache_addr}
        if s.gateway_redis_url is None and redis_url is not None:
            gateway_env["GATEWAY_REDIS_URL"] = redis_url  # stored responses live beside the cache entries
        gateway = self.python("gateway", "gateway", gateway_env)
        base = f"http://{s.gateway_host}:{s.gateway_port}"
        if wait_healthy(gateway, lambda: http_ok(f"{base}/ready"), self.stopping):
            self.lines.append(f"gateway        {base}  (OpenAI API at {base}/v1, metrics {base}/metrics)")
        say("stack is up:\n      " + "\n      ".join(self.lines) + "\n      Ctrl-C stops everything.")

    def watch(self) -> None:
        """Restart children that die, with backoff; the rest keep serving meanwhile."""
        while not self.stopping.wait(WATCH_PERIOD_S):
            for child in self.children:
                self.supervise(child, time.monotonic())

    def supervise(self, child: Child, now: float) -> None:
        if child.alive or self.stopping.is_set():
            return
        if child.restart_at is None:
            ran_for = now - child.started_at
            stable = ran_for >= self.backoff.stable_after_s
            child.failures_in_a_row = 1 if stable else child.failures_in_a_row + 1
            delay = self.backoff.delay(child.failures_in_a_row)
            child.restart_at = now + delay
            code = child.proc.returncode if child.proc else "?"
            say(
                f"{child.name} exited (code {code}) after {ran_for:.1f} s; restarting in {delay:.1f} s "
                f"(restart {child.restarts + 1}); the other services keep running"
            )
        elif now >= child.restart_at:
            child.restart_at = None
            child.restarts += 1
            say(f"restarting {child.name}")
            child.start()

    def down(self) -> None:
        say("stopping ...")
        for child in reversed(self.children):  # gateway first, Redis last
            child.stop()
        say("all stopped")


def main() -> None:
    stack = Stack(StackSettings())

    def on_signal(signum: int, _: object) -> None:
        stack.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.up()
        stack.watch()
    finally:
        stack.down()


if __name__ == "__main__":
    main()
