"""Small builders for engine tests: requests, schedulers, a tiny random Llama, a scripted runner."""

from __future__ import annotations

import itertools

import torch

from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig, SchedulerConfig
from worker.engine.engine import LLMEngine
from worker.engine.outputs import ModelInfo
from worker.engine.request import Request
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler, SchedulerOutput
from worker.model.model import LlamaForPagedAttention
from worker.model.runner import ModelRunner
from worker.model.sampler import SamplerOutput

_ids = itertools.count()


def make_request(
    num_prompt_tokens: int = 10, max_tokens: int = 8, prompt: list[int] | None = None, **params: object
) -> Request:
    prompt = prompt if prompt is not None else [(7 * i + 3) % 200 + 1 for i in range(num_prompt_tokens)]
    sampling = SamplingParams(max_tokens=max_tokens, **{"temperature": 0.0, **params})
    return Request(f"req-{next(_ids)}", list(prompt), sampling, eos_token_id=None, max_tokens=max_tokens)


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 32,
    max_model_len: int = 256,
    prefix_caching: bool = True,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len
    )
    return Scheduler(config, BlockManager(num_blocks, block_size, prefix_caching))


class ScriptedRunner:
    """Stands in for the model: the next token is a fixed function of the sequence so far."""

    def execute(self, plan: SchedulerOutput) -> tuple[list[Request], SamplerOutput]:
        requests = [s.request for s in plan.scheduled if s.samples]
        tokens = [(sum(r.all_token_ids) * 31 + r.num_tokens) % 97 + 3 for r in requests]
        return requests, SamplerOutput(tokens, [None] * len(tokens))

    def release(self, request_id: str) -> None:
        pass


def tiny_llama(seed: int = 0, vocab_size: int = 256, **shape: int) -> torch.nn.Module:
    """A small random Llama; `shape` overrides the config's sizes (hidden_size, num_attention_heads...)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    sizes = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    config = LlamaConfig(
        vocab_size=vocab_size,
        **(sizes | shape),
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    # Larger weights than the default init make logits spread out, so greedy ties are unlikely.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    return model


def paged_runner(
    hf_model: torch.nn.Module,
    num_blocks: int,
    block_size: int,
    linear_backend: str = "auto",
    attention_backend: str = "auto",
    decode_graphs: str = "off",
    max_num_seqs: int = 256,
) -> ModelRunner:
    model = LlamaForPagedAttention(hf_model, max_positions=512, linear_backend=linear_backend)
    return ModelRunner(
        model, num_blocks, block_size, attention_backend, decode_graphs, max_num_seqs, max_model_len=512
    )


def drive(scheduler: Scheduler, runner, max_steps: int = 10_000) -> list[SchedulerOutput]:
    """Run the scheduler with a runner until nothing is left; return every plan."""
    plans = []
    for _ in range(max_steps):
        if not scheduler.num_unfinished:
            return plans
        plan = scheduler.schedule()
        plans.append(plan)
        requests, out = runner.execute(plan)
        scheduler.update_from_output(
            plan, {r.request_id: t for r, t in zip(requests, out.token_ids, strict=True)}
        )
    raise AssertionError("the scheduler did not finish its requests")


class IdTokenizer:
    """Token i is the text `<i>`: enough for the engine's logprob texts and detokenizer."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(part) for part in text.replace(">", "").split("<") if part]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return f"<{token_id}>"


def tiny_engine(
    hf_model: torch.nn.Module,
    vocab_size: int,
    block_size: int,
    budget: int,
    num_blocks: int,
    max_num_seqs: int,
) -> LLMEngine:
    """The whole engine (scheduler, block manager, paged runner, sampler) over a tiny model, ids as text."""
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=256)
    config = EngineConfig(scheduler=sched)  # the KV pool's shape is the block manager's and runner's
    scheduler = Scheduler(sched, BlockManager(num_blocks, block_size, True))
    runner = paged_runner(hf_model, num_blocks, block_size)
    info = ModelInfo("tiny", 256, block_size, num_blocks, "float32", "cpu", max_num_seqs, vocab_size)
    return LLMEngine(config, scheduler, runner, IdTokenizer(), info, None)
