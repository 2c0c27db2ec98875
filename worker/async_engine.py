"""AsyncEngine: the engine loop on its own thread, per-request asyncio streams for the server."""

from __future__ import annotations

from collections.abc import AsyncIterator

from worker.config import EngineConfig
from worker.outputs import EngineStats, FinishedRequestStats, ModelInfo, PromptInput, RequestOutput, StepStats
from worker.sampling_params import SamplingParams


class AsyncEngine:
    """Interface (implementation in progress).

    - `generate(request_id, prompt, params)` returns an async iterator of RequestOutput (one per
      choice per step; each choice's last one has finish_reason and usage). It raises
      InvalidRequestError / EngineOverloadedError / EngineDeadError (worker.errors) before yielding
      anything when the request cannot be accepted. Closing the iterator early (aclose, task
      cancellation) aborts the request and frees its KV blocks.
    - `abort(request_id)` -> bool, `stats()` -> EngineStats, `model_info` -> ModelInfo.
    - `add_step_listener(fn(StepStats))`, `add_finished_listener(fn(FinishedRequestStats))`: called on
      the engine thread after each step, for metrics.
    """

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        raise NotImplementedError

    async def start(self) -> None:
        raise NotImplementedError

    async def shutdown(self) -> None:
        raise NotImplementedError

    def generate(self, request_id: str, prompt: PromptInput, params: SamplingParams) -> AsyncIterator[RequestOutput]:
        raise NotImplementedError

    async def abort(self, request_id: str) -> bool:
        raise NotImplementedError

    def stats(self) -> EngineStats:
        raise NotImplementedError

    @property
    def model_info(self) -> ModelInfo:
        raise NotImplementedError

    def add_step_listener(self, listener) -> None:  # noqa: ANN001
        raise NotImplementedError

    def add_finished_listener(self, listener) -> None:  # noqa: ANN001
        raise NotImplementedError


__all__ = ["AsyncEngine", "StepStats", "FinishedRequestStats"]
