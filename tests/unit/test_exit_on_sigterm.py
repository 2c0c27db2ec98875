"""A benchmark killed with SIGTERM still stops the servers it started (scripts/launch.py exit_on_sigterm):
a real parent process starts a real child, is sent SIGTERM, and its `finally` stops the child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from scripts.launch import exit_on_sigterm, stop_process
    if sys.argv[1] == "on":
        exit_on_sigterm()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        print(child.pid, flush=True)  # inside the try: a SIGTERM right after it must reach the finally
        time.sleep(60)
    finally:
        stop_process(child, timeout_s=5)
    """
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().split()[2] != "Z"


@pytest.mark.parametrize("handler", ["on", "off"])
def test_sigterm_runs_the_finally_that_stops_the_servers(handler: str) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, handler], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=15) == (128 + signal.SIGTERM if handler == "on" else -signal.SIGTERM)
        deadline = time.monotonic() + (5 if handler == "on" else 1)
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive(child) == (handler == "off")  # without the handler the server is left behind
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
