"""The compose stack in a real container engine: up, a chat completion through the gateway, two workers
that both serve, and a worker container killed while the gateway keeps answering.

Minutes long, so opt-in: `make compose-test` builds the images (deploy/build_images.sh) and runs this
with LLMSERVE_COMPOSE_TEST=1. Skipped when not opted in, or when no container engine answers here.
The stack runs as its own compose project with the gateway published on a free loopback port, and is
taken down (volumes included) at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from scripts.launch import ROOT, free_port

OPT_IN = "LLMSERVE_COMPOSE_TEST"
COMPOSE = str(ROOT / "deploy" / "compose.sh")
IMAGES = ("llmserve:latest", "llmserve-redis:latest", "llmserve-prometheus:latest")
UP_TIMEOUT_S = 420.0
SUCCESS = re.compile(r"^llmserve:request_success_total\{[^}]*\} (\S+)$", re.M)

pytestmark = pytest.mark.skipif(
    os.environ.get(OPT_IN) != "1",
    reason=f"brings the compose stack up in a container engine (minutes): `make compose-test` ({OPT_IN}=1)",
)


def sh(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def engine_problem() -> str | None:
    """Why no container engine can be used here, or None."""
    try:
        info = sh("docker", "info", "--format", "{{.ServerVersion}}", timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        return f"no docker client or daemon: {error}"
    if info.returncode != 0:
        return f"the Docker daemon does not answer: {info.stderr.strip()[:300]}"
    return None


@dataclass
class Stack:
    env: dict[str, str]
    url: str

    def compose(self, *args: str, timeout: float = 600) -> str:
        result = sh(COMPOSE, *args, env=self.env, timeout=timeout)
        assert result.returncode == 0, f"compose {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def containers(self, service: str) -> list[str]:
        return self.compose("ps", "-q", service).split()

    def logs(self) -> str:
        return sh(COMPOSE, "logs", "--no-color", "--tail", "40", env=self.env, timeout=120).stdout[-8000:]

    def chat(self, text: str, timeout: float = 120) -> httpx.Response:
        """A chat the semantic cache cannot answer (a new question each time), so a worker serves it."""
        body = {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": f"{text} ({uuid.uuid4().hex[:8]})"}],
            "max_tokens": 8,
            "temperature": 0,
        }
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=timeout)


def wait(condition: object, timeout_s: float, what: str, stack: Stack) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():  # type: ignore[operator]
                return
        except (httpx.HTTPError, AssertionError):
            pass
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{stack.logs()}")


def healthy(container: str) -> bool:
    state = sh("docker", "inspect", "--format", "{{json .State}}", container, timeout=30)
    return state.returncode == 0 and json.loads(state.stdout).get("Health", {}).get("Status") == "healthy"


def served(container: str) -> float:
    """Choices this worker container finished, from its own /metrics (read inside the container)."""
    script = (
        "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9101/metrics').read().decode())"
    )
    result = sh("docker", "exec", container, "python", "-c", script, timeout=60)
    assert result.returncode == 0, result.stderr
    return sum(float(value) for value in SUCCESS.findall(result.stdout))


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    problem = engine_problem()
    if problem:
        pytest.skip(f"no container engine can start here: {problem}")
    missing = [image for image in IMAGES if sh("docker", "image", "inspect", image).returncode != 0]
    assert not missing, f"images {missing} are not built: `make images` (or `make compose-test`) builds them"
    port = free_port()
    env = dict(os.environ) | {
        "COMPOSE_PROJECT_NAME": f"llmserve-test-{os.getpid()}",
        "LLMSERVE_MODELS": "./models",  # the model `make model` made; nothing is fetched
        "GATEWAY_PUBLISH_PORT": str(port),
        "PROMETHEUS_PUBLISH_PORT": str(free_port()),
        # Light engines: the machine running this may have two cores.
        "WORKER_KV_CACHE_GB": "0.25",
        "WORKER_MAX_NUM_SEQS": "8",
    }
    started = Stack(env, f"http://127.0.0.1:{port}")
    try:
        started.compose("up", "-d", "--no-build")
        wait(
            lambda: httpx.get(f"{started.url}/ready", timeout=5).status_code == 200,
            UP_TIMEOUT_S,
            "the gateway to be ready",
            started,
        )
        yield started
    finally:
        sh(COMPOSE, "down", "--volumes", "--remove-orphans", "--timeout", "20", env=env, timeout=300)


def test_a_chat_completion_through_the_gateway(stack: Stack) -> None:
    response = stack.chat("Say hello.")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] > 0


def test_a_reworded_question_is_answered_by_the_semantic_cache(stack: Stack) -> None:
    """The cache container embeds on ONNX Runtime, its export written into the `onnx` volume (owned by the
    service user), and a reworded question is served from the first one's answer."""

    def ask(question: str) -> httpx.Response:
        body = {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 8,
            "temperature": 0,
        }
        response = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response

    first = ask("How do I reset my password?")
    assert first.headers["X-Semantic-Cache"] == "miss"
    hits: list[httpx.Response] = []

    def reworded_hits() -> bool:  # the answer is stored after it is sent: poll
        hits.append(ask("What is the way to reset my password?"))
        return hits[-1].headers["X-Semantic-Cache"] == "hit"

    wait(reworded_hits, 60, "the reworded question to hit", stack)
    answer = first.json()["choices"][0]["message"]["content"]
    assert hits[-1].json()["choices"][0]["message"]["content"] == answer
    (cache,) = stack.containers("cache_service")
    exported = sh("docker", "exec", cache, "sh", "-c", "ls /app/onnx", timeout=60)
    assert exported.returncode == 0, exported
    # the export, and its reference probe vectors beside it (cache_service/onnx_encoder.py)
    (onnx,) = [name for name in exported.stdout.split() if name.endswith(".onnx")]
    assert onnx.removesuffix(".onnx") + ".probe.npy" in exported.stdout.split(), exported.stdout
    logs = sh("docker", "logs", cache, timeout=60)
    assert "on onnxruntime" in logs.stdout + logs.stderr


def test_two_workers_both_serve(stack: Stack) -> None:
    stack.compose("up", "-d", "--no-build", "--no-recreate", "--scale", "worker=2")
    workers = stack.containers("worker")
    assert len(workers) == 2
    wait(lambda: all(healthy(c) for c in workers), UP_TIMEOUT_S, "both workers to be healthy", stack)
    before = {c: served(c) for c in workers}

    def both_served() -> bool:
        assert stack.chat("Count to three.").status_code == 200
        return all(served(c) > before[c] for c in workers)

    wait(both_served, 300, "requests to reach both workers", stack)


def test_the_gateway_keeps_answering_when_a_worker_is_killed(stack: Stack) -> None:
    workers = stack.containers("worker")
    assert len(workers) == 2, "runs after the scale-up test"
    sh("docker", "kill", workers[0], timeout=60)
    answers = [stack.chat(f"Name a colour ({i}).", timeout=60) for i in range(6)]
    assert [r.status_code for r in answers] == [200] * 6, [r.text[:200] for r in answers]
    assert served(workers[1]) > 0
