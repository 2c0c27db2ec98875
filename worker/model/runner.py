"""Turns a scheduler plan into tensors (token ids, positions, slot mapping, block tables), runs the
model over the paged KV pool, and samples. torch lives here, in the model, attention and sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from common.hugepages import huge_zeros
from worker.engine.request import Request
from worker.engine.scheduler import ScheduledRequest, SchedulerOutput
from worker.kernels import native_op, native_ops
from worker.model.attention import AttentionMetadata, PrefillChunk, resolve_attention_backend
from worker.model.decode_graphs import DecodeGraphs
from worker.model.model import LlamaForPagedAttention, ModelShape
from worker.model.sampler import SamplerOutput, build_batch, gather_prompt_logprobs, sample


def kv_bytes_per_block(shape: ModelShape, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * shape.num_layers * block_size * shape.num_kv_heads * shape.head_dim * element


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sampling_requests: list[Request]
    rows_per_request: list[int]  # logits rows of each sampling request: 1, or 1 + its draft tokens
    items: list[ScheduledRequest]  # the plan in batch order: decodes first
    # Prompt logprobs: (request, first prompt position predicted, rows) after the sampling rows of
    # logits_indices, and the prompt token each of those rows predicts.
    prompt_spans: list[tuple[Request, int, int]] = field(default_factory=list)
    prompt_targets: list[int] = field(default_factory=list)
    lora_indices: list[int] | None = None  # per token: its adapter among the step's, -1 base; None: no LoRA


DECODE_GRAPH_MODES = ("off", "eager", "capture")  # eager: the graphs' padded path without capture (tests)


class ModelRunner:
    def __init__(
        self,
        model: LlamaForPagedAttention,
        num_blocks: int,
        block_size: int,
        attention_backend: str = "auto",
        decode_graphs: str = "off",
        max_num_seqs: int = 256,
        max_model_len: int = 2048,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = model.embed.device
        self.dtype = model.embed.dtype
        if not model.supports_native_kernels:
            if attention_backend == "native":
                raise ValueError(
                    f"the native kernels run the Llama layer only; this model needs {sorted(model.needs)}"
                )
            attention_backend = "torch"
        self.attention_backend = resolve_attention_backend(attention_backend, self.device, self.dtype)
        model.use_native_kernels(native_ops() if self.attention_backend == "native" else None)
        if decode_graphs not in DECODE_GRAPH_MODES:
            raise ValueError(f"decode_graphs must be one of {DECODE_GRAPH_MODES}, not {decode_graphs!r}")
        s = model.shape
        # Decode graphs pad their batches with rows that write into one scratch block past the pool.
        pool_blocks = num_blocks + (decode_graphs != "off")
        cache_shape = (s.num_kv_heads, pool_blocks, block_size, s.head_dim)
        self.kv_caches = [(self._pool(cache_shape), self._pool(cache_shape)) for _ in range(s.num_layers)]
        self.generators: dict[str, torch.Generator] = {}
        self.lora = None  # a worker.model.lora.manager.LoraManager once `use_lora` is called
        self.decode_graphs = None
        if decode_graphs != "off":
            self.decode_graphs = DecodeGraphs(
                model,
                self.kv_caches,
                block_size,
                scratch_block=num_blocks,
                max_batch=max_num_seqs,
                max_blocks=-(-max_model_len // block_size),
                capture=decode_graphs == "capture",
            )

    def _pool(self, shape: tuple[int, ...]) -> torch.Tensor:
        """One layer's K or V pool: on huge pages on a CPU (common/hugepages.py), where a decode step reads
        2 KB blocks from anywhere in it."""
        if self.device.type == "cpu":
            return huge_zeros(shape, self.dtype)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def use_lora(self, manager) -> None:
        """Serve LoRA adapters: the projections add each step's low-rank products (worker/model/lora/)."""
        if self.decode_graphs is not None:
            raise ValueError(
                "LoRA adapters do not run inside the CUDA decode graphs yet: set WORKER_ENFORCE_EAGER=true"
            )
        manager.attach(self.model)
        self.lora = manager

    # ---- inputs --------------------------------------------------------------------------
    def prepare(self, plan: SchedulerOutput) -> StepInputs:
        # Decodes (one generated token) first, so their queries are one contiguous slice of the batch.
        items = sorted(plan.scheduled, key=lambda s: not _is_decode(s))
        if self.attention_backend == "native" and items and all(_plain_decode(s) for s in items):
            inputs = self._prepare_decodes(items)
        else:
            inputs = self._prepare_batch(items)
        if self.lora is not None:
            inputs.lora_indices = self.lora.prepare_step(
                [s.num_new_tokens for s in items], [s.request.lora for s in items]
            )
        return inputs

    def _prepare_decodes(self, items: list[ScheduledRequest]) -> StepInputs:
        """A step of one token per sequence, straight from Python lists: the same inputs as `_prepare_batch`
        without its cumsum, repeat_interleave and indexing (about half a millisecond of a one-stream step)."""
        bs, dev = self.block_size, self.device
        positions = [s.start for s in items]
        tables = [s.request.block_ids for s in items]
        num_blocks = max(positions) // bs + 1  # blocks holding the longest context, its new token included
        padded = [(t + [0] * num_blocks)[:num_blocks] for t in tables]
        sampling = [i for i, s in enumerate(items) if s.samples]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(
                [t[p // bs] * bs + p % bs for t, p in zip(tables, positions, strict=True)], device=dev
            ),
            num_decodes=len(items),
            decode_block_tables=torch.tensor(padded, dtype=torch.long, device=dev),
            decode_mask=None,
            prefills=[],
            decode_context_lens=torch.tensor([p + 1 for p in positions], device=dev),
            native_decode=True,
        )
        return StepInputs(
            input_ids=torch.tensor([s.token_ids()[0] for s in items], device=dev),
            positions=torch.tensor(positions, device=dev),
            meta=meta,
            logits_indices=torch.tensor(sampling, dtype=torch.long, device=dev),
            sampling_requests=[items[i].request for i in sampling],
            rows_per_request=[1] * len(sampling),
            items=items,
        )

    def _prepare_batch(self, items: list[ScheduledRequest]) -> StepInputs:
        """Any step: decodes, prefill chunks, draft tokens, prompt logprobs."""
        num_decode_items = sum(1 for s in items if _is_decode(s))
        num_decodes = sum(s.num_new_tokens for s in items[:num_decode_items])  # decode rows
        dev = self.device
        bs = self.block_size
        input_ids: list[int] = []
        for s in items:
            input_ids.extend(s.token_ids())
        lens = torch.tensor([s.num_new_tokens for s in items], dtype=torch.long)
        starts = torch.tensor([s.start for s in items], dtype=torch.long)
        offsets = torch.cumsum(lens, 0) - lens
        seq_of_token = torch.repeat_interleave(torch.arange(len(items)), lens)
        positions = torch.arange(int(lens.sum())) - offsets[seq_of_token] + starts[seq_of_token]
        max_blocks = max(len(s.request.block_ids) for s in items)
        block_tables = torch.tensor(
            [s.request.block_ids + [0] * (max_blocks - len(s.request.block_ids)) for s in items],
            dtype=torch.long,
        )
        slot_mapping = block_tables[seq_of_token, positions // bs] * bs + positions % bs
        context_lens = starts + lens
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            num_decodes=num_decodes,
            decode_block_tables=None,
            decode_mask=None,
            prefills=[],
            native_prefill=self.attention_backend == "native",
        )
        if num_decodes:
            # One row per token: each sees its sequence's cache up to itself (all of the step's K/V is
            # written before attention reads it), as if its own decode step computed it.
            dec_ctx = positions[:num_decodes] + 1
            dec_blocks = int((dec_ctx.max() + bs - 1) // bs)
            dec_tables = block_tables[seq_of_token[:num_decodes], :dec_blocks]
            meta.decode_block_tables = dec_tables.contiguous().to(dev)
            meta.decode_context_lens = dec_ctx.contiguous().to(dev)
            if self.attention_backend == "native":
                meta.native_decode = True
            else:
                span = torch.arange(dec_blocks * bs)
                mask = span.unsqueeze(0) >= dec_ctx.unsqueeze(1)
                meta.decode_mask = mask.view(1, num_decodes, 1, -1).to(dev)
        for i in range(num_decode_items, len(items)):
            ctx = int(context_lens[i])
            meta.prefills.append(
                PrefillChunk(
                    int(offsets[i]), int(lens[i]), ctx, block_tables[i, : (ctx + bs - 1) // bs].to(dev)
                )
            )
        sampling = [i for i, s in enumerate(items) if s.samples]
        ends = (offsets + lens).tolist()
        rows_per_request = [1 + len(items[i].draft_token_ids) for i in sampling]
        logits_rows = [
            row
            for i, n in zip(sampling, rows_per_request, strict=True)
            for row in range(ends[i] - n, ends[i])
        ]
        prompt_spans, prompt_targets = [], []
        for i, s in enumerate(items):
            if s.request.wants_prompt_logprobs:
                # Row of position q predicts prompt token q + 1, for q up to the last prompt token but one.
                prompt = s.request.prompt_token_ids
                end = min(s.start + s.num_new_tokens, len(prompt) - 1)
                if end > s.start:
                    first_row = ends[i] - s.num_new_tokens
                    prompt_spans.append((s.request, s.start, end - s.start))
                    logits_rows.extend(range(first_row, first_row + end - s.start))
                    prompt_targets.extend(prompt[s.start + 1 : end + 1])
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=dev),
            positions=positions.to(dev),
            meta=meta,
            logits_indices=torch.tensor(logits_rows, dtype=torch.long, device=dev),
            sampling_requests=[items[i].request for i in sampling],
            rows_per_request=rows_per_request,
            items=items,
            prompt_spans=prompt_spans,
            prompt_targets=prompt_targets,
        )

    # ---- execution -----------------------------------------------------------------------
    def _graph_decode(self, plan: SchedulerOutput) -> torch.Tensor | None:
        """Logits of a step that only decodes, one token per sequence, through the decode graphs;
        None when the step needs the general path (prefill, drafts, prompt logprobs, a shape too large)."""
        graphs, items = self.decode_graphs, plan.scheduled
        if graphs is None or not items:
            return None
        if not all(_plain_decode(s) and s.samples for s in items):
            return None
        tokens = [s.token_ids()[0] for s in items]
        return graphs.run(tokens, [s.start for s in items], [s.request.block_ids for s in items])

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Make the block manager's (from, to) block moves in every layer's K and V pool, in order."""
        if not copies:
            return
        pools = [pool for pair in self.kv_caches for pool in pair]
        ops = native_op("copy_blocks") if self.device.type == "cpu" else None
        if ops is not None:
            from_ids, to_ids = (torch.tensor(ids, dtype=torch.long) for ids in zip(*copies, strict=True))
            ops.copy_blocks(pools, from_ids, to_ids)
            return
        for src, dst in copies:
            for pool in pools:
                pool[:, dst].copy_(pool[:, src])

    def execute(self, plan: SchedulerOutput) -> tuple[list[Request], SamplerOutput]:
        """Run one step; return the requests that produced a token and what they produced."""
        self.copy_blocks(plan.block_copies)
        logits = self._graph_decode(plan)
        if logits is not None:
            requests = [s.request for s in plan.scheduled]
            return requests, self._sample(requests, logits)
        inputs = self.prepare(plan)
        logits = self.model.forward(
            inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches, inputs.logits_indices
        )
        prompt_logprobs = []
        if inputs.prompt_spans:  # their rows come after the sampling rows
            num_sampling_rows = sum(inputs.rows_per_request)
            prompt_logprobs = self._prompt_logprobs(logits[num_sampling_rows:], inputs)
            logits = logits[:num_sampling_rows]
        requests = inputs.sampling_requests
        if not requests:
            return [], SamplerOutput([], [], prompt_logprobs)
        if len(logits) == len(requests):
            out = self._sample(requests, logits)
            out.prompt_logprobs = prompt_logprobs
            return requests, out
        # Some requests ran draft tokens: sample every request at its last row; a drafting request
        # (always greedy) also gets the argmax at each draft position, for verification.
        ends = torch.tensor(inputs.rows_per_request).cumsum(0)
        out = self._sample(requests, logits.index_select(0, (ends - 1).to(logits.device)))
        greedy = logits.argmax(dim=-1).tolist()
        for i, (end, rows) in enumerate(zip(ends.tolist(), inputs.rows_per_request, strict=True)):
            if rows > 1:
                out.token_ids[i] = greedy[end - rows : end]
        out.prompt_logprobs = prompt_logprobs
        return requests, out

    def _sample(self, requests: list[Request], logits: torch.Tensor) -> SamplerOutput:
        """One token per request from its row of float logits."""
        for request in requests:
            self._ensure_generator(request)
        return sample(
            logits, build_batch(requests, self.generators, self.model.shape.vocab_size, self.device)
        )

    def _prompt_logprobs(self, logits: torch.Tensor, inputs: StepInputs) -> list:
        """(request, first position, entries) per request whose prompt rows ran this step."""
        num_top = max(request.params.prompt_logprobs for request, _, _ in inputs.prompt_spans)
        targets = torch.tensor(inputs.prompt_targets, dtype=torch.long, device=logits.device)
        entries = gather_prompt_logprobs(logits, targets, num_top)
        out, row = [], 0
        for request, start, count in inputs.prompt_spans:
            k = request.params.prompt_logprobs
            span = [(lp, rank, ids[:k], values[:k]) for lp, rank, ids, values in entries[row : row + count]]
            out.append((request, start, span))
            row += count
        return out

    def all_logits(self, plan: SchedulerOutput) -> tuple[list[ScheduledRequest], torch.Tensor]:
        """Logits of every token in the step, in the runner's order (for tests against transformers)."""
        self.copy_blocks(plan.block_copies)
        logits = self._graph_decode(plan)
        if logits is not None:  # a view of the graphs' output buffer, which the next step overwrites
            return list(plan.scheduled), logits.float().clone()
        inputs = self.prepare(plan)
        logits = self.model.forward(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches, None)
        return inputs.items, logits.float()

    def _ensure_generator(self, request: Request) -> None:
        seed = request.params.seed
        if seed is not None and request.request_id not in self.generators:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed + request.index)
            self.generators[request.request_id] = generator

    def release(self, request_id: str) -> None:
        self.generators.pop(request_id, None)


def _is_decode(item: ScheduledRequest) -> bool:
    """Tokens past the prompt, each run as a decode row: the next token, draft tokens after it, or the
    generated tokens of a preempted request computed again (each row rounds as its own decode step did, so
    a resumed request and a speculative one compute the logits plain decoding does). A prompt's last token
    alone (the rest of it from the prefix cache) is a prefill chunk of one: run by the decode kernels, its
    logits and K/V differed from the same prompt's prefilled whole by a bfloat16 rounding."""
    return item.start >= item.request.num_prompt_tokens


def _plain_decode(item: ScheduledRequest) -> bool:
    """One decode row and nothing else to compute: no draft tokens, no prompt logprobs."""
    return item.num_new_tokens == 1 and _is_decode(item) and not item.request.wants_prompt_logprobs
