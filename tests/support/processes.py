"""A child process of a test: started with only the environment the test gives it, logged to a file,
ready when its probe says so, stopped with SIGTERM (or killed, to play a crash)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.net import OWN_ENV_PREFIXES, REDIS_SERVER, ROOT

START_TIMEOUT_S = 180.0


@dataclass
class Service:
    """One `python -m ...` (or redis-server) child process with its log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready: Callable[[], bool]
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> Service:
        env = {k: v for k, v in os.environ.items() if not k.startswith(OWN_ENV_PREFIXES)}
        env.update(self.env)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        with self.log_path.open("ab") as log:  # a restarted service appends to the same log
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.ready():
                    return self
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {START_TIMEOUT_S:g} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Die without any goodbye, as a crashed or OOM-killed process does."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def redis_argv(port: int, data_dir: Path) -> list[str]:
    """A throwaway redis-server on loopback: no snapshots, no append-only file."""
    return [str(REDIS_SERVER), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(data_dir)]
