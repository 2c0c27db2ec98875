"""Wiring: load a model, size the KV pool from the memory budget, and plug a runner into an engine. The
engine layer below takes its runner as a parameter, so it is built (and tested) without torch or a model."""

from __future__ import annotations

import logging
import time

import torch
from transformers import GenerationConfig

from common import hugepages
from common.linear import Linear, warm_up_linears
from worker.engine.async_engine import AsyncEngine
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig, SchedulerConfig
from worker.engine.engine import LLMEngine
from worker.engine.outputs import ModelInfo
from worker.engine.scheduler import Scheduler
from worker.model.loader import (
    check_model_type,
    load_model,
    load_tokenizer,
    resolve_precision,
    torch_dtype,
)
from worker.model.runner import ModelRunner, kv_bytes_per_block

log = logging.getLogger(__name__)


def build_async_engine(config: EngineConfig, **options: object) -> AsyncEngine:
    """An AsyncEngine that builds its LLMEngine (loads the model) on its own thread when started."""
    return AsyncEngine(lambda: build_engine(config), **options)  # type: ignore[arg-type]


def build_engine(config: EngineConfig) -> LLMEngine:
    """Load the model and tokenizer, size the KV pool from the memory budget, wire everything."""
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    log.info("%d torch threads", torch.get_num_threads())
    hugepages.set_enabled(config.huge_pages)  # before the weights and the KV pool are allocated
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    sched, cache = config.scheduler, config.kv_cache
    dtype, quantization = resolve_precision(config.dtype, config.quantization, device, config.model)
    check_model_type(config.model)  # an unsupported architecture fails here, before anything loads
    tokenizer = load_tokenizer(config.model)
    model = load_model(config.model, dtype, device, sched.max_model_len, config.linear_backend, quantization)
    if device == "cpu":  # oneDNN compiles each row count's kernels now, not in the first steps that meet it
        started = time.perf_counter()
        head = {model.lm_head: _logits_rows(sched)} if isinstance(model.lm_head, Linear) else {}
        runs = warm_up_linears(sched.max_num_batched_tokens, head)
        log.info("linear layers warmed up: %d products in %.1f s", runs, time.perf_counter() - started)
    num_blocks = cache.num_blocks or int(
        cache.kv_cache_memory_gb
        * 2**30
        // kv_bytes_per_block(model.shape, cache.block_size, torch_dtype(dtype))
    )
    graphs = "capture" if device.startswith("cuda") and not config.enforce_eager else "off"
    runner = ModelRunner(
        model,
        num_blocks,
        cache.block_size,
        config.attention_backend,
        decode_graphs=graphs,
        max_num_seqs=sched.max_num_seqs,
        max_model_len=sched.max_model_len,
    )
    if config.lora.enabled:
        from worker.model.lora.startup import start_lora

        start_lora(config, model, runner, device)
        sched.max_loras = config.lora.max_loras
    block_manager = BlockManager(
        num_blocks, cache.block_size, cache.enable_prefix_caching, move_cached_blocks=device == "cpu"
    )
    scheduler = Scheduler(sched, block_manager)
    eos_ids = _eos_token_ids(config.model, tokenizer, GenerationConfig)
    info = ModelInfo(
        model_name=config.served_model_name or config.model,
        max_model_len=sched.max_model_len,
        block_size=cache.block_size,
        num_kv_blocks=num_blocks,
        dtype=dtype,
        device=device,
        quantization=quantization,
        max_num_seqs=sched.max_num_seqs,
        vocab_size=model.shape.vocab_size,
    )
    engine = LLMEngine(
        config, scheduler, runner, tokenizer, info, eos_ids[0] if eos_ids else None, tuple(eos_ids[1:])
    )
    engine.grammars.prefetch()  # llguidance's view of the vocabulary takes seconds: built in the background
    return engine


def _logits_rows(sched: SchedulerConfig) -> int:
    """The most rows a step's LM head meets outside prompt logprobs: one a sequence, or each of a
    speculating sequence's draft tokens and the token after them."""
    return max(sched.max_num_seqs, sched.speculative_max_batch * (1 + sched.num_speculative_tokens))


def _eos_token_ids(path: str, tokenizer, generation_config_cls) -> list[int]:
    """The generation config's EOS ids (what transformers' generate stops on), else the tokenizer's."""
    try:
        eos = generation_config_cls.from_pretrained(path).eos_token_id
    except OSError:
        eos = None
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
    return list(dict.fromkeys(ids))
