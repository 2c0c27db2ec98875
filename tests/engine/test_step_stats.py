"""The engine's step stats (what llmserve:generation_tokens_total and the ITL histogram are fed) count the
tokens a request kept, as its usage does, with a scripted model whose drafts are always accepted."""

from __future__ import annotations

from tests.engine.factories import IdTokenizer
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig, SchedulerConfig
from worker.engine.engine import LLMEngine
from worker.engine.outputs import ModelInfo, PromptInput, RequestOutput
from worker.engine.request import Request
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler, SchedulerOutput
from worker.model.sampler import SamplerOutput

CYCLE = (5, 6, 7, 8)  # the scripted model always continues this cycle, so n-gram drafts are always right


def _next(token: int) -> int:
    return CYCLE[(CYCLE.index(token) + 1) % len(CYCLE)]


class CycleRunner:
    """One token per sampling request, or the model's choice at each draft position plus the next."""

    def execute(self, plan: SchedulerOutput) -> tuple[list[Request], SamplerOutput]:
        requests, tokens = [], []
        for item in plan.scheduled:
            if not item.samples:
                continue
            token = item.request.all_token_ids[item.request.num_tokens - 1]
            choices = []
            for _ in range(len(item.draft_token_ids) + 1):
                token = _next(token)
                choices.append(token)
            requests.append(item.request)
            tokens.append(choices if item.draft_token_ids else choices[0])
        return requests, SamplerOutput(tokens, [None] * len(tokens))

    def release(self, request_id: str) -> None:
        pass


def speculating_engine(num_speculative_tokens: int = 4) -> LLMEngine:
    sched = SchedulerConfig(
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        num_speculative_tokens=num_speculative_tokens,
    )
    scheduler = Scheduler(sched, BlockManager(64, 4, True))
    info = ModelInfo("cycle", 256, 4, 64, "float32", "cpu", 4, 256)
    return LLMEngine(EngineConfig(scheduler=sched), scheduler, CycleRunner(), IdTokenizer(), info, None)


def run(engine: LLMEngine, params: SamplingParams) -> tuple[list[RequestOutput], int, int, int]:
    """Outputs, and the generated tokens, TTFTs and ITLs the steps reported."""
    engine.add(engine.make_requests("r", PromptInput(token_ids=[*CYCLE, *CYCLE]), params))
    outputs, generated, ttfts, itls = [], 0, 0, 0
    while engine.has_unfinished():
        result = engine.step()
        outputs += result.outputs
        if result.stats is not None:
            generated += result.stats.num_generation_tokens
            ttfts += len(result.stats.time_to_first_tokens_s)
            itls += len(result.stats.inter_token_latencies_s)
    return outputs, generated, ttfts, itls


def test_tokens_after_a_stop_string_in_one_step_are_not_counted_as_generated() -> None:
    """Drafts make one step produce several tokens; a stop string met at the first of them drops the rest
    (they are neither sent nor in the usage), so the metrics must not count them either."""
    engine = speculating_engine()
    outputs, generated, ttfts, itls = run(
        engine, SamplingParams(max_tokens=30, temperature=0.0, stop=["<5><6>"])
    )
    usage = outputs[-1].usage
    assert outputs[-1].finish_reason == "stop"
    assert sum(len(o.token_ids) for o in outputs) == usage.completion_tokens == 2
    assert generated == usage.completion_tokens
    assert ttfts == 1
    assert itls == usage.completion_tokens - 1


def test_accepted_drafts_are_each_counted_with_a_gap_of_their_own() -> None:
    engine = speculating_engine()
    outputs, generated, ttfts, itls = run(engine, SamplingParams(max_tokens=12, temperature=0.0))
    assert outputs[-1].usage.completion_tokens == generated == 12
    assert (ttfts, itls) == (1, 11)
