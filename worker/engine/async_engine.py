"""AsyncEngine: the engine loop on its own thread, one asyncio stream per request for the server.

The engine thread is the only owner of engine state (scheduler, block manager, live groups). The
event loop talks to it in one direction with commands (add, abort) on a queue, and hears back in
the other with each step's outputs (`call_soon_threadsafe`) and an immutable snapshot of the
engine's counters, republished after every round of the loop. Admission (queue full, duplicate
ids) is decided on the engine thread too, so no counter is ever changed from two threads.

Closing a stream early (client gone, task cancelled, deadline passed) aborts its request, so its
KV blocks are freed at the next round of the loop.

The engine thread also loads the model: torch work on a thread other than the one that allocated
the weights ran clearly slower per step on the CPU (figures: docs/BENCHMARKS.md, engine notes,
"Threading"), so every tensor the steps touch is created by the thread that runs them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from worker.engine.engine import LLMEngine, StepResult
from worker.engine.errors import (
    AlreadyExistsError,
    EngineDeadError,
    EngineDrainingError,
    EngineOverloadedError,
    EngineStalledError,
)
from worker.engine.heap import HeapTrimmer
from worker.engine.lora_registry import LoraRef
from worker.engine.output_stream import OutputStream
from worker.engine.outputs import (
    EngineStats,
    FinishedRequestStats,
    ModelInfo,
    PromptInput,
    RequestOutput,
    StepStats,
)
from worker.engine.request import Request
from worker.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

StepListener = Callable[[StepStats], None]
FinishedListener = Callable[[FinishedRequestStats], None]
IDLE_WAIT_S = 0.5  # an idle loop still goes round this often, so its heartbeat stays fresh
DEBUG_STALL_POLL_S = 0.05


@dataclass(frozen=True)
class EngineSnapshot:
    """What the event loop may know of the engine, published by the engine thread."""

    stats: EngineStats
    num_unfinished: int
    heartbeat: float  # time.monotonic() when the engine loop last went round


class AsyncEngine:
    def __init__(
        self,
        engine_factory: Callable[[], LLMEngine],
        stall_timeout_s: float = 30.0,
        debug_stall_file: str | None = None,
    ) -> None:
        self._engine_factory = engine_factory
        self.engine: LLMEngine | None = None  # built on, and owned by, the engine thread
        self.stall_timeout_s = stall_timeout_s
        self._heap = HeapTrimmer()
        self._debug_stall_file = debug_stall_file  # test hook: steps wait while this file exists
        self._model_info: ModelInfo | None = None
        self._snapshot: EngineSnapshot | None = None
        self._commands: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._streams: dict[str, OutputStream] = {}  # event loop only
        self._admitting = True  # event loop only
        self._step_listeners: tuple[StepListener, ...] = ()
        self._finished_listeners: tuple[FinishedListener, ...] = ()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model on the engine thread and start its loop; returns once it serves."""
        if self._thread is not None:
            raise RuntimeError("the engine is already started")
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = self._loop.create_future()
        self._thread = threading.Thread(
            target=self._thread_main, args=(ready,), name="engine-loop", daemon=True
        )
        self._thread.start()
        await ready

    def _thread_main(self, ready: asyncio.Future) -> None:
        try:
            self.engine = self._engine_factory()
            self._model_info = self.engine.model_info
            self._publish_snapshot()
        except BaseException as exc:
            self._dead = exc
            self._post(_settle, ready, exc)
            return
        self._post(_settle, ready, None)
        self._run()

    def stop_admitting(self) -> None:
        """Drain: requests in flight go on, new ones are refused (EngineDrainingError)."""
        self._admitting = False

    async def shutdown(self) -> None:
        self._admitting = False
        self._stopping.set()
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
        self._fail_all(EngineDeadError("the engine is shutting down"))

    @property
    def draining(self) -> bool:
        """True once stop_admitting() was called (event loop only)."""
        return not self._admitting

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    @property
    def num_in_flight(self) -> int:
        """Requests whose streams are open (event loop only)."""
        return len(self._streams)

    def stalled_for(self) -> float:
        """Seconds the engine loop has made no progress while requests wait on it; 0 when idle."""
        snapshot = self._snapshot
        if snapshot is None or not self._streams:
            return 0.0
        return max(0.0, time.monotonic() - snapshot.heartbeat)

    @property
    def is_stalled(self) -> bool:
        return self.stalled_for() > self.stall_timeout_s

    # ---- API -----------------------------------------------------------------------------
    async def generate(
        self, request_id: str, prompt: PromptInput, params: SamplingParams, lora: LoraRef | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs (on the LoRA adapter `lora`, if given); errors are raised before the
        first output."""
        self._check_admitting()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._streams:
            raise AlreadyExistsError(f"request id {request_id!r} is already in use", "request_id")
        params = dataclasses.replace(
            params, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids)
        )
        # Tokenizing reads only what never changes after start-up (tokenizer, limits).
        requests = await asyncio.to_thread(self.engine.make_requests, request_id, prompt, params, lora)
        self._check_admitting()
        if request_id in self._streams:
            raise AlreadyExistsError(f"request id {request_id!r} is already in use", "request_id")
        stream = OutputStream()
        self._streams[request_id] = stream
        self._submit("add", requests)
        remaining = params.n
        try:
            while remaining:
                for item in await stream.drain():
                    if isinstance(item, BaseException):
                        remaining = 0
                        raise item
                    if item.finished:
                        remaining -= 1
                    yield item
        finally:
            self._streams.pop(request_id, None)
            if remaining:
                self._submit("abort", request_id)

    def _check_admitting(self) -> None:
        if not self.is_running:
            raise EngineDeadError("the engine is not running")
        if not self._admitting:
            raise EngineDrainingError("the worker is shutting down")
        if self.is_stalled:
            raise EngineStalledError(f"the engine has made no progress for {self.stalled_for():.0f} s")

    async def tokenize(self, prompt: PromptInput, add_special_tokens: bool) -> tuple[list[int], list[str]]:
        """Token ids (and their texts) as Generate would see the prompt; on a thread, like admission."""
        if not self.is_running:
            raise EngineDeadError("the engine is not running")
        return await asyncio.to_thread(self.engine.tokenize_for_client, prompt, add_special_tokens)

    async def detokenize(self, token_ids: list[int]) -> str:
        if not self.is_running:
            raise EngineDeadError("the engine is not running")
        return await asyncio.to_thread(self.engine.detokenize, token_ids)

    async def abort(self, request_id: str) -> bool:
        """Abort a request by id; False when no stream of that id is open here."""
        found = request_id in self._streams
        if found:
            self._submit("abort", request_id)
        return found

    def snapshot(self) -> EngineSnapshot:
        if self._snapshot is None:
            raise EngineDeadError("the engine is not started")
        return self._snapshot

    def stats(self) -> EngineStats:
        """The counters as of the engine loop's last round (never read from engine state directly)."""
        return self.snapshot().stats

    @property
    def lora(self):  # the LoraManager (thread-safe registry), or None when adapters are not served
        return self.engine.lora if self.engine is not None else None

    @property
    def model_info(self) -> ModelInfo:
        if self._model_info is None:
            raise EngineDeadError("the engine is not started")
        return self._model_info

    def add_step_listener(self, listener: StepListener) -> None:
        """Called on the engine thread after each step with work (or aborts) to report."""
        self._step_listeners = (*self._step_listeners, listener)

    def add_finished_listener(self, listener: FinishedListener) -> None:
        self._finished_listeners = (*self._finished_listeners, listener)

    # ---- engine thread -------------------------------------------------------------------
    def _submit(self, kind: str, payload: object) -> None:
        self._commands.put((kind, payload))
        self._wakeup.set()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._apply_commands()
                if not self.engine.has_unfinished():
                    self._step()  # reports aborts that emptied the engine
                    self._heap.maybe_trim()
                    self._wakeup.wait(timeout=IDLE_WAIT_S)
                    self._wakeup.clear()
                    continue
                self._hold_while_debug_stall()
                self._step()
                self._heap.maybe_trim()
        except BaseException as exc:  # the loop must never die silently
            log.exception("engine loop crashed")
            self._dead = exc
            self._post(self._fail_all, EngineDeadError(f"the engine loop crashed: {exc}"))

    def _step(self) -> None:
        """One engine step. The snapshot goes out before the outputs, so a client that has its last token
        already sees the stats of the step that produced it (blocks freed, the request no longer running)."""
        result = self.engine.step()
        self._publish_snapshot()
        self._publish(result)

    def _hold_while_debug_stall(self) -> None:
        """Test hook (WORKER_DEBUG_STALL_FILE, off by default): play a hung step while the file exists."""
        if self._debug_stall_file is None:
            return
        while os.path.exists(self._debug_stall_file) and not self._stopping.is_set():
            time.sleep(DEBUG_STALL_POLL_S)

    def _apply_commands(self) -> None:
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._add(payload)  # type: ignore[arg-type]
            else:
                outputs = self.engine.abort(payload)  # type: ignore[arg-type]
                if outputs:
                    self._post(self._deliver, outputs)

    def _add(self, requests: list[Request]) -> None:
        """Admit a request, or fail its stream alone (queue full, id in use)."""
        try:
            max_waiting = self.engine.scheduler.config.max_waiting
            if len(self.engine.scheduler.waiting) >= max_waiting:
                raise EngineOverloadedError(f"the worker's queue is full ({max_waiting} requests waiting)")
            self.engine.add(requests)
        except Exception as exc:
            self._post(self._deliver_error, requests[0].group_id, exc)

    def _publish_snapshot(self) -> None:
        self._snapshot = EngineSnapshot(
            self.engine.stats(), self.engine.scheduler.num_unfinished, time.monotonic()
        )

    def _publish(self, result: StepResult) -> None:
        if result.outputs:
            self._post(self._deliver, result.outputs)
        if result.stats is not None:
            for listener in self._step_listeners:
                self._call_listener(listener, result.stats)
        for finished in result.finished:
            for listener in self._finished_listeners:
                self._call_listener(listener, finished)

    @staticmethod
    def _call_listener(listener: Callable, item: object) -> None:
        try:
            listener(item)
        except Exception:
            log.exception("metrics listener failed")

    def _post(self, fn: Callable, *args: object) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed between the check and the call
                pass

    # ---- event loop side -----------------------------------------------------------------
    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.group_id)
            if stream is not None:
                stream.put(output)

    def _deliver_error(self, request_id: str, exc: BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in list(self._streams.values()):
            stream.put(exc)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
