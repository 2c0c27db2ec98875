"""The synchronous engine: schedule, run, update, detokenize. One call to `step()` is one iteration."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from worker.engine.chat_template import render_chat
from worker.engine.config import EngineConfig
from worker.engine.detokenizer import IncrementalDetokenizer, TokenTexts
from worker.engine.errors import AlreadyExistsError, ContextLengthError, InvalidRequestError
from worker.engine.lora_registry import LoraRef, LoraUnavailableError
from worker.engine.outputs import (
    EngineStats,
    FinishedRequestStats,
    ModelInfo,
    PositionLogprobs,
    PromptInput,
    RequestOutput,
    StepStats,
    TokenLogprob,
    Usage,
)
from worker.engine.request import Request, RequestStatus
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import Scheduler
from worker.engine.structured_output import GrammarCache, GrammarError

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    outputs: list[RequestOutput]
    stats: StepStats | None
    finished: list[FinishedRequestStats]


class LLMEngine:
    """Owns the scheduler, the model runner and the per-choice text state.

    Not thread-safe: one thread calls `add`, `abort` and `step`. `make_requests` only reads shared
    state and may run on any thread (it tokenizes, which is the slow part of admission).
    """

    def __init__(
        self,
        config: EngineConfig,
        scheduler: Scheduler,
        runner,
        tokenizer,
        model_info: ModelInfo,
        eos_token_id: int | None,
        extra_stop_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.runner = runner
        self.tokenizer = tokenizer
        self.model_info = model_info
        self.eos_token_id = eos_token_id
        self.extra_stop_token_ids = extra_stop_token_ids
        self.token_texts = TokenTexts(tokenizer)
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}  # per live choice
        self.groups: dict[str, list[str]] = {}  # group id -> choice request ids still live
        self.num_finished = 0
        self._aborted_stats: list[FinishedRequestStats] = []
        eos_ids = [eos_token_id, *extra_stop_token_ids] if eos_token_id is not None else []
        self.grammars = GrammarCache(tokenizer, eos_ids, model_info.vocab_size)
        self.lora = getattr(runner, "lora", None)  # the LoraManager when adapters are served (thread-safe)
        self._lora_loads_seen = 0

    # ---- admission -----------------------------------------------------------------------
    def tokenize(self, prompt: PromptInput) -> list[int]:
        if prompt.token_ids is not None:
            ids = list(prompt.token_ids)
            bad = [t for t in ids if not 0 <= t < self.model_info.vocab_size]
            if bad:
                message = f"token id {bad[0]} is out of range [0, {self.model_info.vocab_size})"
                raise InvalidRequestError(message, param="prompt")
        elif prompt.messages is not None:
            if not prompt.messages:
                raise InvalidRequestError("messages must not be empty", param="prompt")
            try:
                text = render_chat(
                    self.tokenizer,
                    prompt.messages,
                    prompt.tools,
                    prompt.add_generation_prompt,
                    prompt.continue_final_message,
                    prompt.template_kwargs,
                    prompt.documents,
                )
            except Exception as exc:  # a template error is the caller's input problem
                param = getattr(exc, "param", None)  # an option set wrongly (TemplateOptionError)
                raise InvalidRequestError(f"could not apply the chat template: {exc}", param=param) from exc
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        elif prompt.text is not None:
            ids = self.tokenizer.encode(prompt.text)
        else:
            raise InvalidRequestError("a prompt is required", param="prompt")
        if not ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        keep = prompt.truncate_prompt_tokens
        if keep is not None:  # vLLM's: the last k tokens (-1: as many as the context holds)
            ids = ids[-(self.scheduler.config.max_model_len if keep == -1 else keep) :]
        return ids

    def tokenize_for_client(self, prompt: PromptInput, add_special: bool) -> tuple[list[int], list[str]]:
        """/tokenize: chat prompts exactly as Generate renders them; plain text with or without BOS/EOS."""
        if prompt.text is not None:
            ids = self.tokenizer.encode(prompt.text, add_special_tokens=add_special)
        else:
            ids = self.tokenize(prompt)
        return ids, [self.token_texts.lookup(t)[0] for t in ids]

    def detokenize(self, token_ids: list[int]) -> str:
        bad = [t for t in token_ids if not 0 <= t < self.model_info.vocab_size]
        if bad:
            message = f"token id {bad[0]} is out of range [0, {self.model_info.vocab_size})"
            raise InvalidRequestError(message, param="prompt")  # the ids to detokenize: an echoed prompt's
        return self.tokenizer.decode(token_ids)

    def make_requests(
        self, request_id: str, prompt: PromptInput, params: SamplingParams, lora: LoraRef | None = None
    ) -> list[Request]:
        """Validate and tokenize; one Request per choice (with `lora`: on that adapter). Raises
        InvalidRequestError."""
        try:
            params.validate()
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param=getattr(exc, "param", None)) from exc
        prompt_ids = self.tokenize(prompt)
        max_model_len = self.scheduler.config.max_model_len
        max_tokens = params.max_tokens  # 0: the prompt is scored (its logprobs), nothing is sampled
        if max_tokens is None:
            max_tokens = max(max_model_len - len(prompt_ids), 1)  # at least 1: check_fits reports the numbers
        try:
            self.scheduler.check_fits(len(prompt_ids), max_tokens)
        except ValueError as exc:
            raise ContextLengthError(str(exc)) from exc
        if self.extra_stop_token_ids and not params.ignore_eos:
            params.stop_token_ids = list(params.stop_token_ids) + list(self.extra_stop_token_ids)
        out_of_range = [t for t in params.logit_bias if not 0 <= t < self.model_info.vocab_size]
        if out_of_range:
            raise InvalidRequestError(f"logit_bias: token id {out_of_range[0]} is out of range")
        request_id = request_id or uuid.uuid4().hex
        bad_word_ids = self._bad_word_ids(params.bad_words)
        return [
            Request(
                request_id=request_id if params.n == 1 else f"{request_id}#{i}",
                prompt_token_ids=prompt_ids,
                params=params,
                eos_token_id=self.eos_token_id,
                max_tokens=max_tokens,
                group_id=request_id,
                index=i,
                grammar=self._grammar(params),
                lora=lora,
                bad_word_ids=bad_word_ids,
            )
            for i in range(params.n)
        ]

    def _bad_word_ids(self, words: list[str]) -> list[list[int]]:
        """Each word's token sequence as it would be generated mid-text and at the start (with and without a
        leading space), as vLLM matches them; each distinct sequence once."""
        sequences: dict[tuple[int, ...], None] = {}
        for word in words:
            for text in (word, f" {word.lstrip()}"):
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids:
                    sequences[tuple(ids)] = None
        return [list(ids) for ids in sequences]

    def _grammar(self, params: SamplingParams):
        """A fresh matcher when the output is constrained (compiled once per spec, then copied)."""
        if params.structured_output is None:
            return None
        try:
            return self.grammars.matcher(params.structured_output)
        except GrammarError as exc:
            # OpenAI's word for any output constraint (the gateway's guided_* and forced tool calls too)
            raise InvalidRequestError(str(exc), param="response_format") from exc

    def add(self, requests: list[Request]) -> None:
        group = requests[0].group_id
        if group in self.groups:
            raise AlreadyExistsError(f"request id {group!r} is already in use", "request_id")
        # a choice of n > 1 runs as "<id>#<index>", which a client may also send as its own id (each live
        # choice has its detokenizer, the runner its state, under that id)
        taken = next((r.request_id for r in requests if r.request_id in self.detokenizers), None)
        if taken is not None:
            message = f"request id {group!r}: its choice id {taken!r} is in use by another request"
            raise AlreadyExistsError(message, "request_id")
        for request in requests:
            self.scheduler.add_request(request)
            self.detokenizers[request.request_id] = IncrementalDetokenizer(
                self.tokenizer,
                request.params.stop,
                request.params.skip_special_tokens,
                request.params.include_stop_str_in_output,
            )
        self.groups[group] = [r.request_id for r in requests]

    def abort(self, group_id: str) -> list[RequestOutput]:
        """Abort every live choice of a request; their blocks are freed now."""
        outputs = []
        for request_id in list(self.groups.get(group_id, [])):
            request = self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
            if request is not None:
                outputs.append(self._final_output(request, []))
                self._aborted_stats.append(self._finished_stats(request, time.monotonic()))
        return outputs

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- one iteration -------------------------------------------------------------------
    def step(self) -> StepResult:
        start = time.perf_counter()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            # Nothing to run, but aborts since the last step still have to reach the metrics.
            finished_stats, self._aborted_stats = self._aborted_stats, []
            stats = self._step_stats(plan, start, 0, [], []) if finished_stats else None
            return StepResult([], stats, finished_stats)
        scheduled_at = time.monotonic()
        for item in plan.scheduled:
            if item.request.first_scheduled_time is None:
                item.request.first_scheduled_time = scheduled_at
        try:
            requests, sampled = self.runner.execute(plan)
        except LoraUnavailableError as exc:  # nothing of the step ran: abort that adapter's requests, go on
            log.error("%s; aborting its requests", exc)
            groups = {r.group_id for r in self.scheduler.requests.values() if r.lora_id == exc.ref.lora_id}
            return StepResult([out for group in groups for out in self.abort(group)], None, [])
        for request, start, entries in sampled.prompt_logprobs:  # a rerun after preemption overwrites
            del request.prompt_logprobs[start:]
            request.prompt_logprobs.extend(entries)
        by_request = {
            r.request_id: (tok, lp)
            for r, tok, lp in zip(requests, sampled.token_ids, sampled.logprobs, strict=True)
        }
        new_tokens, finished = self.scheduler.update_from_output(
            plan, {k: v[0] for k, v in by_request.items()}
        )
        for request, token in new_tokens:  # constrained requests: the matcher follows every accepted token
            if request.grammar is not None:
                request.grammar.accept(token)
        now = time.monotonic()
        ttfts, itls = [], []
        num_generated = 0
        outputs: list[RequestOutput] = []
        finished_ids = {r.request_id for r in finished}
        per_request: dict[str, tuple[Request, list[int]]] = {}
        for request, token in new_tokens:  # several tokens per request when drafts were accepted
            per_request.setdefault(request.request_id, (request, []))[1].append(token)
        for request_id, (request, tokens) in per_request.items():
            # Timed and counted once a stop string has cut the step's tokens: those after it are never sent.
            tokens = self._apply_stop_strings(request, tokens, finished, finished_ids)
            num_generated += len(tokens)
            if request.first_token_time is None:
                request.first_token_time = now
                ttfts.append(now - request.arrival_time)
            else:
                itls.extend([(now - request.last_token_time) / len(tokens)] * len(tokens))
            request.last_token_time = now
            logprobs = self._logprobs(tokens[0], by_request[request_id][1])
            ended_on_stop = request_id in finished_ids and self._ended_on_stop_token(request, tokens[-1])
            if logprobs and ended_on_stop and not request.params.include_stop_str_in_output:
                logprobs = []  # like OpenAI: logprobs cover the returned text, here without the stop token
            if request_id in finished_ids:
                output = self._final_output(request, tokens, logprobs)
            else:
                delta = self.detokenizers[request_id].take_delta(False)
                output = RequestOutput(request.group_id, request.index, delta, tokens, logprobs)
            if request.wants_prompt_logprobs:  # the prompt has run whole: they go with the first token
                output.prompt_logprobs = self._take_prompt_logprobs(request)
            outputs.append(output)
        for request in finished:
            if request.request_id not in per_request:  # max_tokens 0: its prompt ran whole, nothing sampled
                output = self._final_output(request, [])
                output.prompt_logprobs = self._take_prompt_logprobs(request)
                outputs.append(output)
        stats = self._step_stats(plan, start, num_generated, ttfts, itls)
        finished_stats = self._aborted_stats + [self._finished_stats(r, now) for r in finished]
        self._aborted_stats = []
        return StepResult(outputs, stats, finished_stats)

    @staticmethod
    def _ended_on_stop_token(request: Request, token: int) -> bool:
        params = request.params
        if request.status != RequestStatus.FINISHED_STOPPED:
            return False
        return (token == request.eos_token_id and not params.ignore_eos) or token in params.stop_token_ids

    def _apply_stop_strings(
        self, request: Request, tokens: list[int], finished: list[Request], finished_ids: set[str]
    ) -> list[int]:
        """Feed this step's tokens to the detokenizer; on a stop string, finish the request there
        and drop any later tokens of the step. Stop strings count from min_tokens on, as in vLLM: one met
        earlier stays in the text. A stop token that ended the request (EOS, stop_token_ids) is not fed,
        as in vLLM, unless the request asked for it (include_stop_str_in_output)."""
        detokenizer = self.detokenizers[request.request_id]
        before = request.num_output_tokens - len(tokens)
        text_tokens = tokens
        if request.request_id in finished_ids and not request.params.include_stop_str_in_output:
            if self._ended_on_stop_token(request, tokens[-1]):
                text_tokens = tokens[:-1]
        for j, token in enumerate(text_tokens):
            if detokenizer.add_token(token, check_stop=before + j + 1 >= request.params.min_tokens):
                extra = len(tokens) - j - 1
                if extra:
                    del request.output_token_ids[-extra:]
                    del request.all_token_ids[-extra:]
                if request.request_id in finished_ids:
                    request.status = RequestStatus.FINISHED_STOPPED
                else:
                    self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
                    finished.append(request)
                    finished_ids.add(request.request_id)
                return tokens[: j + 1]
        return tokens

    # ---- outputs -------------------------------------------------------------------------
    def _final_output(self, request: Request, tokens: list[int], logprobs=None) -> RequestOutput:
        detokenizer = self.detokenizers.pop(request.request_id)
        self.runner.release(request.request_id)
        live = self.groups.get(request.group_id, [])
        if request.request_id in live:
            live.remove(request.request_id)
        if not live:
            self.groups.pop(request.group_id, None)
        self.num_finished += 1
        usage = Usage(request.num_prompt_tokens, request.num_output_tokens, max(request.num_cached_tokens, 0))
        return RequestOutput(
            request.group_id,
            request.index,
            detokenizer.take_delta(True),
            tokens,
            logprobs,
            request.status.finish_reason,
            usage,
        )

    def _logprobs(self, token: int, sampled) -> list[PositionLogprobs] | None:
        if sampled is None:
            return None
        chosen, top_ids, top_values = sampled
        return [
            PositionLogprobs(
                self._token_logprob(token, chosen),
                [self._token_logprob(t, v) for t, v in zip(top_ids, top_values, strict=True)],
            )
        ]

    def _token_logprob(self, token_id: int, logprob: float, rank: int = 0) -> TokenLogprob:
        text, raw = self.token_texts.lookup(token_id)
        return TokenLogprob(token_id, text, logprob, raw, rank)

    def _take_prompt_logprobs(self, request: Request) -> list[PositionLogprobs]:
        """Every prompt position: the prompt token (with its rank) and the top ones (ranks 1, 2, ...).
        Position 0 has no logprob: only its token, with rank 0."""
        entries, request.prompt_logprobs = request.prompt_logprobs, []
        request.prompt_logprobs_sent = True
        prompt = request.prompt_token_ids
        return [PositionLogprobs(self._token_logprob(prompt[0], 0.0))] + [
            PositionLogprobs(
                self._token_logprob(token, logprob, rank),
                [self._token_logprob(t, v, r) for r, (t, v) in enumerate(zip(ids, values, strict=True), 1)],
            )
            for token, (logprob, rank, ids, values) in zip(prompt[1:], entries, strict=True)
        ]

    def _step_stats(self, plan, start: float, num_generated: int, ttfts: list, itls: list) -> StepStats:
        bm = self.scheduler.block_manager
        prompt_tokens = sum(
            max(0, min(s.start + s.num_new_tokens, s.request.num_prompt_tokens) - s.start)
            for s in plan.scheduled
        )
        return StepStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_kv_blocks_used=bm.num_used_blocks,
            num_kv_blocks_total=bm.num_blocks,
            batch_size=len(plan.scheduled),
            num_batched_tokens=plan.num_batched_tokens,
            step_time_s=time.perf_counter() - start,
            num_preemptions=len(plan.preempted),
            prefix_cache_queries=plan.prefix_queries,
            prefix_cache_hits=plan.prefix_hits,
            num_prompt_tokens=prompt_tokens,
            num_generation_tokens=num_generated,
            num_kv_block_copies=len(plan.block_copies),
            time_to_first_tokens_s=ttfts,
            inter_token_latencies_s=itls,
            running_lora_adapters=_adapters(self.scheduler.running) if self.lora is not None else (),
            waiting_lora_adapters=_adapters(self.scheduler.waiting) if self.lora is not None else (),
            num_lora_loads=self._new_lora_loads(),
        )

    def _new_lora_loads(self) -> int:
        """Adapters read from disk since the last call (the registry counts them on its own threads too)."""
        if self.lora is None:
            return 0
        loads = self.lora.registry.num_loads
        new, self._lora_loads_seen = loads - self._lora_loads_seen, loads
        return new

    @staticmethod
    def _finished_stats(request: Request, now: float) -> FinishedRequestStats:
        scheduled = request.first_scheduled_time or now
        return FinishedRequestStats(
            finish_reason=request.status.finish_reason or "abort",
            prompt_tokens=request.num_prompt_tokens,
            generation_tokens=request.num_output_tokens,
            cached_tokens=max(request.num_cached_tokens, 0),
            queue_time_s=scheduled - request.arrival_time,
            e2e_latency_s=now - request.arrival_time,
        )

    def stats(self) -> EngineStats:
        bm = self.scheduler.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_kv_blocks_used=bm.num_used_blocks,
            num_kv_blocks_total=bm.num_blocks,
            prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_finished=self.num_finished,
        )


def _adapters(requests) -> tuple[str, ...]:
    """The distinct adapter names of `requests`, sorted (the base model is none)."""
    return tuple(sorted({r.lora.name for r in requests if r.lora is not None}))
