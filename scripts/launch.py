"""Start a service process and wait until it is healthy: the one launcher of the tests, the benchmarks and
`make run` (scripts/run_stack.py), asking the one health probe the containers use (common/healthcheck.py).

A `Service` is one child process with its log file: started with only the environment it is given (our own
WORKER_*, CACHE_*, GATEWAY_* ... variables of the caller are left out), ready when its probe says so,
stopped with SIGTERM (or killed, to play a crash). `start_worker`, `start_gateway`, `start_cache_service`
and `start_redis` start one of each on free loopback ports.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from common.cpus import cgroup_cpu_limit, default_threads, usable_cpus
from common.healthcheck import check_grpc, check_http
from worker.engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[1]
REDIS_SERVER = Path(sys.executable).parent / "redis-server"
MODEL_NAME = PurePath(EngineConfig.model).name  # what `make model` fetches and the worker serves by default
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 45.0  # longer than the services' 30 s drain
# Environment variables of ours: a child gets only the ones its starter sets.
OWN_ENV_PREFIXES = ("WORKER_", "CACHE_", "GATEWAY_", "REDIS_URL", "API_KEY")
# Modest worker settings: the tests and benchmarks share two cores. One thread: a test worker shares the cores
# with the test client, the gateway and the cache service, and torch's OpenMP workers wait actively at every
# barrier, so two threads on cores other processes hold made a 96-token answer take 97 s instead of 3.5 s.
SMALL_WORKER_ENV = {"WORKER_KV_CACHE_GB": "0.25", "WORKER_MAX_NUM_SEQS": "16", "WORKER_NUM_THREADS": "1"}


def stack_default_threads() -> dict[str, str]:
    """WORKER_NUM_THREADS as one worker picks it when unset (common/cpus.py), for the benchmarks that measure
    the stack at its defaults rather than the tests' one-thread worker."""
    return {"WORKER_NUM_THREADS": str(default_threads(usable_cpus(), cgroup_cpu_limit()))}


class StartError(RuntimeError):
    """A service exited during start-up or was not healthy in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def grpc_serving(addr: str, timeout_s: float = 1.0) -> bool:
    """grpc.health.v1 says SERVING for the server as a whole."""
    return check_grpc(addr, "", timeout_s)[0]


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """A 2xx answer."""
    return check_http(url, timeout_s)[0]


def wait_ready(
    proc: subprocess.Popen,
    ready: Callable[[], bool],
    name: str,
    timeout_s: float = START_TIMEOUT_S,
    log_tail: Callable[[], str] = lambda: "",
    stopping: threading.Event | None = None,
    poll_s: float = 0.2,
) -> float:
    """Poll `ready` until it holds; the seconds that took. StartError when the process exits first, when
    `timeout_s` runs out, or when `stopping` is set."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s and not (stopping is not None and stopping.is_set()):
        if proc.poll() is not None:
            raise StartError(f"{name} exited during start-up (code {proc.returncode}):\n{log_tail()}")
        try:
            if ready():
                return time.monotonic() - started
        except Exception:  # not listening yet
            pass
        time.sleep(poll_s)
    if stopping is not None and stopping.is_set():
        raise StartError(f"{name}: start-up interrupted")
    raise StartError(f"{name} not ready after {timeout_s:g} s:\n{log_tail()}")


def exit_on_sigterm() -> None:
    """Unwind on SIGTERM as on Ctrl-C, so a benchmark's `finally` blocks stop the servers it started: by
    default SIGTERM ends Python without running them and leaves those servers behind."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def stop_process(proc: subprocess.Popen | None, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (the services drain on it), then a kill after `timeout_s`."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def clean_env(env: dict[str, str]) -> dict[str, str]:
    """Our environment without our own settings, plus `env`; offline Hugging Face, unbuffered Python."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(OWN_ENV_PREFIXES)}
    out.update(env)
    out.setdefault("HF_HUB_OFFLINE", "1")
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


@dataclass
class Service:
    """One `python -m ...` (or redis-server) child process with its log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready: Callable[[], bool]
    addr: str = ""  # host:port (gRPC) or http://host:port, for the caller
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    startup_s: float = field(default=0.0, init=False)  # how long the last start took to be ready

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Service:
        return start_together([self], timeout_s)[0]

    def launch(self) -> None:
        """The process, without waiting for it to be ready (`start` waits)."""
        with self.log_path.open("ab") as log:  # a restarted service appends to the same log
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=clean_env(self.env), stdout=log, stderr=subprocess.STDOUT
            )

    def wait_until(self, ready: Callable[[], bool], timeout_s: float = START_TIMEOUT_S) -> float:
        """Wait for a further condition of the started service (a gateway's /ready, say)."""
        assert self.proc is not None
        return wait_ready(self.proc, ready, self.name, timeout_s, self.log_tail)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Die without any goodbye, as a crashed or OOM-killed process does."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 20.0) -> None:
        stop_process(self.proc, timeout_s)


def start_together(services: list[Service], timeout_s: float = START_TIMEOUT_S) -> list[Service]:
    """Launch every service, then wait for each to be ready: their starts overlap (a worker's is seconds of
    imports and loading). One that fails stops them all."""
    try:
        for service in services:
            service.launch()
        for s in services:
            assert s.proc is not None
            s.startup_s = wait_ready(s.proc, s.ready, s.name, timeout_s, s.log_tail)
    except BaseException:
        for service in services:
            service.stop()
        raise
    return services


def python_service(
    name: str, module: str, env: dict[str, str], log_dir: Path, ready: Callable[[], bool], addr: str
) -> Service:
    """`python -m module`, not started yet."""
    return Service(name, [sys.executable, "-m", module], env, log_dir / f"{name}.log", ready, addr)


def worker_service(name: str, log_dir: Path, **env: str) -> Service:
    port = int(env.get("WORKER_PORT") or free_port())
    addr = f"127.0.0.1:{port}"
    full = SMALL_WORKER_ENV | {"WORKER_PORT": str(port), "WORKER_METRICS_PORT": str(free_port())} | env
    return python_service(name, "worker", full, log_dir, lambda: grpc_serving(addr), addr)


def gateway_service(
    name: str, log_dir: Path, worker_addr: str, route: str = "/health", **env: str
) -> Service:
    """A gateway, up once `route` answers 200 (/health: the process; /ready: a worker answers too)."""
    port = int(env.get("GATEWAY_PORT") or free_port())
    url = f"http://127.0.0.1:{port}"
    # No semantic cache and no stored responses unless asked: a test gateway never touches a stray Redis.
    off = {"CACHE_ENABLED": "false", "GATEWAY_REDIS_URL": ""}
    full = {"GATEWAY_PORT": str(port), "WORKER_ADDR": worker_addr} | off | env
    return python_service(name, "gateway", full, log_dir, lambda: http_ok(url + route), url)


def cache_service(name: str, log_dir: Path, redis_url: str, **env: str) -> Service:
    port = int(env.get("CACHE_PORT") or free_port())
    addr = f"127.0.0.1:{port}"
    full = {"CACHE_PORT": str(port), "CACHE_METRICS_PORT": str(free_port()), "REDIS_URL": redis_url} | env
    return python_service(name, "cache_service", full, log_dir, lambda: grpc_serving(addr), addr)


def start_worker(name: str, log_dir: Path, **env: str) -> Service:
    """A worker on a free port (SMALL_WORKER_ENV unless `env` says otherwise); `.addr` is host:port."""
    return worker_service(name, log_dir, **env).start()


def start_gateway(name: str, log_dir: Path, worker_addr: str, ready: bool = False, **env: str) -> Service:
    """A gateway (semantic cache and stored responses off unless `env` turns them on), up once /health
    answers (with `ready`: once /ready does, a worker answering too); `.addr`: its URL."""
    route = "/ready" if ready else "/health"
    return gateway_service(name, log_dir, worker_addr, route, **env).start()


def start_cache_service(name: str, log_dir: Path, redis_url: str, **env: str) -> Service:
    return cache_service(name, log_dir, redis_url, **env).start()


def metrics_url(service: Service, port_var: str) -> str:
    """The /metrics URL of a worker (WORKER_METRICS_PORT) or cache service (CACHE_METRICS_PORT)."""
    return f"http://127.0.0.1:{service.env[port_var]}/metrics"


def redis_argv(port: int, data_dir: Path) -> list[str]:
    """A throwaway redis-server on loopback: no snapshots, no append-only file."""
    return [
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
        str(data_dir),
    ]


def redis_service(log_dir: Path, name: str | None = None) -> tuple[Service, str]:
    """A throwaway redis-server (data in `log_dir`), not started yet, and its URL."""
    import redis

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    name = name or f"redis-{port}"

    def ready() -> bool:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())

    return Service(name, redis_argv(port, log_dir), {}, log_dir / f"{name}.log", ready, url), url


def start_redis(log_dir: Path, name: str | None = None) -> tuple[Service, str]:
    service, url = redis_service(log_dir, name)
    return service.start(), url
