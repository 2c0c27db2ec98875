"""Per-iteration continuous batching under a token budget. Pure Python: data in, plan out.

Each step `schedule()` returns a plan (which requests run how many tokens); the runner executes it;
`update_from_output()` applies the sampled tokens. Running requests are served first (their decodes
and the rest of chunked prefills), so a long prompt never stalls the decodes of others; the remaining
budget admits waiting requests in arrival order. When blocks run out, the most recently admitted
running request is preempted: its blocks are freed and it goes back to the head of the queue, to be
recomputed (mostly from the prefix cache) later.

A waiting request whose next uncached prompt block another request is prefilling right now (two requests
of one tenant arriving together) waits for it, for a step or two at most, instead of computing the same
blocks beside it: once they are cached it hits them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from worker.engine.block_manager import BlockManager
from worker.engine.config import SchedulerConfig
from worker.engine.request import Request, RequestStatus
from worker.engine.speculative import can_speculate, num_accepted, propose_ngram_drafts

# A request waits for another's prefill of its leading blocks for at most this many steps, and only when
# those blocks are due within this step and the next (so it never starves behind a long chunked prefill).
MAX_PREFIX_WAITS = 2


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens run this step, draft tokens included
    start: int  # position of the first token run this step (== computed tokens before it)
    draft_token_ids: list[int] = field(default_factory=list)  # speculative tokens after the known ones

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the known tokens, and so produces the next one (never with
        max_tokens 0: such a request only scores its prompt)."""
        reaches_end = self.start + self.num_new_tokens - len(self.draft_token_ids) == self.request.num_tokens
        return reaches_end and self.request.max_tokens > 0

    def token_ids(self) -> list[int]:
        known = self.request.all_token_ids[self.start : self.start + self.num_new_tokens]
        return known + self.draft_token_ids


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    prefix_queries: int = 0  # tokens new requests looked up (not preempted ones resuming)
    prefix_hits: int = 0  # of those, tokens found
    # (from, to) KV block copies to make, in order, before the step runs (BlockManager.take_copies)
    block_copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


def tokens_to_run(request: Request, start: int, budget: int) -> int:
    """How many known tokens a request computes from `start` this step, in chunks of the budget: the prompt
    first, then the generated tokens of a preempted request resuming, never both in one step. The runner
    computes each generated token as a decode row, as its decode step first computed it (a prefill chunk
    rounds a bfloat16 row otherwise, and would change the logits that follow)."""
    end = request.num_prompt_tokens if start < request.num_prompt_tokens else request.num_tokens
    return min(end - start, budget)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0

    # ---- admission -----------------------------------------------------------------------
    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raise ValueError if a request could never run, whatever else is going on."""
        total = num_prompt_tokens + max_tokens
        if total > self.config.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
                f"requested {total} tokens ({num_prompt_tokens} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        if self.block_manager.blocks_needed(total) > self.block_manager.num_blocks:
            capacity = self.block_manager.num_blocks * self.block_manager.block_size
            raise ValueError(
                f"The request needs {total} tokens of KV cache but the whole cache holds {capacity} tokens."
            )

    def add_request(self, request: Request) -> None:
        self.check_fits(request.num_prompt_tokens, request.max_tokens)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Finish (stop, length or abort) a request wherever it is; its blocks are freed now."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        self.block_manager.free(request)
        return request

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    # ---- one step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        out.block_copies = self.block_manager.take_copies()
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = tokens_to_run(request, request.num_computed_tokens, budget)
            at_end = request.num_computed_tokens + num_new == request.num_tokens
            drafts = self._drafts(request, budget) if num_new == 1 and at_end else []
            while not self.block_manager.allocate(request, num_new + len(drafts)):
                if drafts:
                    drafts = []  # speculation is optional: never preempt anyone for it
                    continue
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    return budget
            out.scheduled.append(
                ScheduledRequest(request, num_new + len(drafts), request.num_computed_tokens, drafts)
            )
            num_new += len(drafts)
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        loras = {r.lora_id for r in self.running if r.lora_id}
        held_back: list[Request] = []  # their adapter would exceed max_loras: they wait, others go on
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if request.lora_id and request.lora_id not in loras and len(loras) >= self.config.max_loras:
                held_back.append(self.waiting.popleft())
                continue
            if self._sibling_prefilling(request):
                break  # let the first choice fill the shared prompt blocks, then hit them
            # Prompt logprobs need every prompt row's logits: such a prompt runs whole (as vLLM does).
            cached = [] if request.wants_prompt_logprobs else self.block_manager.find_cached_prefix(request)
            if self._prefix_due(request, len(cached), out):
                request.num_prefix_waits += 1
                held_back.append(self.waiting.popleft())
                continue  # the blocks it would recompute are cached after this step: then it hits them
            num_cached = len(cached) * self.block_manager.block_size
            num_new = tokens_to_run(request, num_cached, budget)
            if not self.block_manager.allocate(request, num_new, cached):
                break
            self.waiting.popleft()
            # The metrics count a first lookup only, as vLLM's: a victim resuming re-finds its own blocks.
            if not request.num_preemptions:
                out.prefix_queries += request.num_tokens
                out.prefix_hits += num_cached
            self.block_manager.record_prefix_query(request.num_tokens, num_cached)  # every lookup: the load
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_cached
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            if request.lora_id:
                loras.add(request.lora_id)
            out.scheduled.append(ScheduledRequest(request, num_new, request.num_computed_tokens))
            budget -= num_new
        self.waiting.extendleft(reversed(held_back))

    def _drafts(self, request: Request, budget: int) -> list[int]:
        """Draft tokens for a decode, when the batch is small enough for them to be nearly free."""
        k = self.config.num_speculative_tokens
        if not k or len(self.running) > self.config.speculative_max_batch or not can_speculate(request):
            return []
        room = min(
            k,
            budget - 1,
            request.max_tokens - request.num_output_tokens - 1,
            self.config.max_model_len - request.num_tokens - 1,
        )
        return propose_ngram_drafts(request.all_token_ids, room) if room > 0 else []

    def _prefix_due(self, request: Request, num_cached: int, out: SchedulerOutput) -> bool:
        """Whether the request's first uncached full prompt block is being prefilled by a running request
        and will be computed by the end of the next step (this step's plan, then at most a full budget);
        never for a request that waited MAX_PREFIX_WAITS steps already or wants prompt logprobs."""
        bm = self.block_manager
        if (
            not bm.enable_prefix_caching
            or request.wants_prompt_logprobs
            or request.num_prefix_waits >= MAX_PREFIX_WAITS
        ):
            return False
        num_full = (request.num_tokens - 1) // bm.block_size  # as find_cached_prefix: never the last token
        prefilling = [r for r in self.running if r.num_computed_tokens < r.num_prompt_tokens]
        if num_cached >= num_full or not prefilling:
            return False
        wanted = bm.chain_hashes(request, num_cached + 1)[-1]
        planned = {s.request.request_id: s.num_new_tokens for s in out.scheduled}
        for other in prefilling:
            index = num_cached  # the same block sits at the same index of a chain with the same hash
            if (index + 1) * bm.block_size > other.num_prompt_tokens:
                continue
            if index < other.num_computed_tokens // bm.block_size:
                continue  # already computed there, yet not cached: a block owned by a duplicate
            if bm.chain_hashes(other, index + 1)[-1] != wanted:
                continue
            done_after_step = other.num_computed_tokens + planned.get(other.request_id, 0)
            if (index + 1) * bm.block_size <= done_after_step + self.config.max_num_batched_tokens:
                return True
        return False

    def _sibling_prefilling(self, request: Request) -> bool:
        if not self.block_manager.enable_prefix_caching or request.group_id == request.request_id:
            return False
        if request.num_prompt_tokens <= self.block_manager.block_size:
            return False
        return any(
            r.group_id == request.group_id and r.num_computed_tokens < r.num_prompt_tokens
            for r in self.running
        )

    def _preempt(self, request: Request) -> None:
        """Free its blocks and queue it first; it resumes by computing its tokens again (tokens_to_run)."""
        self.block_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    # ---- results -------------------------------------------------------------------------
    def update_from_output(
        self, plan: SchedulerOutput, sampled: dict[str, int | list[int]]
    ) -> tuple[list[tuple[Request, int]], list[Request]]:
        """Advance computed tokens, append sampled tokens, finish what hit a stop condition.

        `sampled` holds one token per sampling request, or, for a request that ran draft tokens,
        the model's greedy choice at each of its last 1 + len(drafts) positions. Returns
        (request, new token) pairs, in order, and the requests that finished this step.
        """
        new_tokens: list[tuple[Request, int]] = []
        finished: list[Request] = []
        for item in plan.scheduled:
            request = item.request
            if request.is_finished or request.status != RequestStatus.RUNNING:
                continue  # aborted while the step ran
            result = sampled.get(request.request_id)
            tokens = result if isinstance(result, list) else [] if result is None else [result]
            accepted = num_accepted(item.draft_token_ids, tokens)
            # K/V is valid up to the last accepted draft; rejected drafts' slots get rewritten later.
            computed = item.start + item.num_new_tokens - len(item.draft_token_ids) + accepted
            status = None
            for token in tokens[: accepted + 1]:
                request.append_output_token(token)
                new_tokens.append((request, token))
                status = self._stop_status(request, token)
                if status is not None:
                    break
            request.num_computed_tokens = min(computed, request.num_tokens)
            self.block_manager.cache_full_blocks(request)  # finished blocks stay reusable too
            if request.max_tokens == 0 and request.num_computed_tokens == request.num_tokens:
                status = RequestStatus.FINISHED_LENGTH  # its prompt ran whole: scored, nothing to sample
            if status is not None:
                self.finish_request(request.request_id, status)
                finished.append(request)
        return new_tokens, finished

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        params = request.params
        # Below min_tokens the sampler masks stop tokens, unless a completed grammar allows nothing else.
        if request.num_output_tokens >= params.min_tokens or request.grammar is not None:
            if not params.ignore_eos and token == request.eos_token_id:
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= request.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
