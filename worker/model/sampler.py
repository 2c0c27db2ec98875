"""Batched sampling on tensors: penalties, temperature, top-k, top-p, min-p, seeds, logprobs.

Every row draws by inverse CDF: one uniform number per row against the row's running sum, exact. A seeded
row takes its number from its own generator, so its tokens do not depend on what else shares the batch.
On the CPU every row is drawn by the compiled kernel (temperature, top-k, top-p, min-p and the draw in one
pass), seeded or not. Rows with nothing else to apply (the common case) go in one call, from the logits in
the model's dtype; the rows that change their logits first (penalties, bias, bans, grammars) get those
changes on float32 copies of their own rows, then the same kernel, as a batch of their own. Elsewhere (CUDA,
or a build without the kernels) the torch path does it all. One top-p request among 64 rows had sent them
all through that path: a full sort of every row, ~130 ms a step on a 2-core AMX Xeon against ~2 ms for the
kernel; 8 top-k rows among 64 still cost 17 ms a step there, and 8 rows with a presence penalty and top-p
the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from common.native_kernels import native_op
from worker.engine.request import Request


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # [B], 1.0 for greedy rows
    greedy: torch.Tensor  # [B] bool
    all_greedy: bool
    top_k: torch.Tensor | None  # [B] long, 0 = off
    top_p: torch.Tensor | None  # [B]
    min_p: torch.Tensor | None  # [B]
    generators: list[torch.Generator | None]
    presence: torch.Tensor | None  # [B]
    frequency: torch.Tensor | None
    repetition: torch.Tensor | None
    output_tokens: torch.Tensor | None  # [B, Lmax], padded with vocab_size
    seen_tokens: torch.Tensor | None  # [B, Lmax'] prompt + output, padded with vocab_size
    banned: list[tuple[int, list[int]]]  # (row, token ids) masked: stops below min_tokens, bad words' ends
    num_logprobs: list[int | None]
    logits_as_is: list[bool]  # per row: nothing changes its logits before temperature and truncation
    logit_bias: list[tuple[int, list[int], list[float]]] = field(default_factory=list)  # (row, ids, biases)
    grammars: list[tuple[int, object]] = field(default_factory=list)  # (row, Grammar) of constrained rows
    allowed: list[tuple[int, list[int]]] = field(default_factory=list)  # (row, the only ids it may sample)

    def select(self, rows: list[int]) -> SamplingBatch:
        """The batch of these rows alone, renumbered in this order."""
        new = {old: i for i, old in enumerate(rows)}
        index = torch.tensor(rows, dtype=torch.long, device=self.temperature.device)

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.index_select(0, index)

        greedy = take(self.greedy)
        return SamplingBatch(
            temperature=take(self.temperature),
            greedy=greedy,
            all_greedy=bool(greedy.all()),
            top_k=take(self.top_k),
            top_p=take(self.top_p),
            min_p=take(self.min_p),
            generators=[self.generators[r] for r in rows],
            presence=take(self.presence),
            frequency=take(self.frequency),
            repetition=take(self.repetition),
            output_tokens=take(self.output_tokens),
            seen_tokens=take(self.seen_tokens),
            banned=[(new[row], ids) for row, ids in self.banned if row in new],
            num_logprobs=[self.num_logprobs[r] for r in rows],
            logit_bias=[(new[row], ids, biases) for row, ids, biases in self.logit_bias if row in new],
            grammars=[(new[row], grammar) for row, grammar in self.grammars if row in new],
            allowed=[(new[row], ids) for row, ids in self.allowed if row in new],
            logits_as_is=[self.logits_as_is[r] for r in rows],
        )


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # Per row: None, or (chosen logprob, top ids, top logprobs)
    logprobs: list[tuple[float, list[int], list[float]] | None]
    # (request, first prompt position, [(logprob, rank, top ids, top logprobs)]) of prompt rows run this step
    prompt_logprobs: list[tuple[Request, int, list]] = field(default_factory=list)


def _padded(rows: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


def build_batch(
    requests: list[Request], generators: dict[str, torch.Generator], vocab_size: int, device: torch.device
) -> SamplingBatch:
    params = [r.params for r in requests]
    greedy = [p.greedy for p in params]
    temperature = torch.tensor(
        [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)], device=device
    )
    any_top_k = any(p.top_k > 0 for p in params)
    any_top_p = any(p.top_p < 1.0 for p in params)
    any_min_p = any(p.min_p > 0.0 for p in params)
    any_penalty = any(p.presence_penalty or p.frequency_penalty for p in params)
    any_repetition = any(p.repetition_penalty != 1.0 for p in params)
    banned = []
    for row, (request, p) in enumerate(zip(requests, params, strict=True)):
        ids = []
        if request.num_output_tokens < p.min_tokens:
            ids = list(p.stop_token_ids)
            if request.eos_token_id is not None and not p.ignore_eos:
                ids.append(request.eos_token_id)
        if request.bad_word_ids:
            ids += _bad_word_tails(request)
        if ids:
            banned.append((row, ids))

    banned_rows = {row for row, _ in banned}

    def column(values: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return SamplingBatch(
        temperature=temperature,
        greedy=column(greedy, torch.bool),
        all_greedy=all(greedy),
        top_k=column([p.top_k for p in params], torch.long) if any_top_k else None,
        top_p=column([p.top_p for p in params]) if any_top_p else None,
        min_p=column([p.min_p for p in params]) if any_min_p else None,
        generators=[generators.get(r.request_id) for r in requests],
        presence=column([p.presence_penalty for p in params]) if any_penalty else None,
        frequency=column([p.frequency_penalty for p in params]) if any_penalty else None,
        repetition=column([p.repetition_penalty for p in params]) if any_repetition else None,
        output_tokens=_padded([r.output_token_ids for r in requests], vocab_size, device)
        if any_penalty
        else None,
        seen_tokens=_padded([r.all_token_ids for r in requests], vocab_size, device)
        if any_repetition
        else None,
        banned=banned,
        num_logprobs=[p.logprobs for p in params],
        logit_bias=[
            (row, list(p.logit_bias), list(p.logit_bias.values()))
            for row, p in enumerate(params)
            if p.logit_bias
        ],
        grammars=[(row, r.grammar) for row, r in enumerate(requests) if r.grammar is not None],
        allowed=[(row, p.allowed_token_ids) for row, p in enumerate(params) if p.allowed_token_ids],
        logits_as_is=[
            not (p.presence_penalty or p.frequency_penalty)
            and p.repetition_penalty == 1.0
            and not p.logit_bias
            and not p.allowed_token_ids
            and r.grammar is None
            and row not in banned_rows
            for row, (r, p) in enumerate(zip(requests, params, strict=True))
        ],
    )


def _bad_word_tails(request: Request) -> list[int]:
    """The last token of each bad word whose other tokens the output ends with (vLLM's bad_words)."""
    out = request.output_token_ids
    tails = []
    for ids in request.bad_word_ids:
        head = len(ids) - 1
        if head == 0 or (len(out) >= head and out[len(out) - head :] == ids[:head]):
            tails.append(ids[-1])
    return tails


def _token_pairs(tokens: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct (row, token) pairs of a [B, L] tensor padded with `vocab`, with how often each occurs."""
    rows = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(1).expand_as(tokens)
    real = tokens < vocab
    keys, counts = torch.unique(rows[real] * vocab + tokens[real], return_counts=True)
    return keys // vocab, keys % vocab, counts


def _apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> None:
    """In vLLM's order: the repetition penalty (HF's: divide positive logits, multiply negative ones, for
    tokens of the prompt or the output), then OpenAI's frequency and presence penalties (per occurrence in
    the output, and once per token that occurred). Each touches only the tokens that occurred."""
    vocab = logits.shape[1]
    if batch.repetition is not None:
        rows, ids, _ = _token_pairs(batch.seen_tokens, vocab)
        values, penalty = logits[rows, ids], batch.repetition[rows].to(logits.dtype)
        logits[rows, ids] = torch.where(values > 0, values / penalty, values * penalty)
    if batch.output_tokens is not None:
        rows, ids, counts = _token_pairs(batch.output_tokens, vocab)
        penalty = batch.frequency[rows] * counts.to(logits.dtype) + batch.presence[rows]
        logits.index_put_((rows, ids), -penalty.to(logits.dtype), accumulate=True)


def _truncating_rows(batch: SamplingBatch) -> torch.Tensor:
    """The rows with top-k or top-p on: only they are sorted (a full sort of the vocabulary, ~1.6 ms a row
    on a 2-core AMX Xeon), while a batch here may hold rows that came for a penalty alone."""
    truncates = torch.zeros(batch.temperature.shape[0], dtype=torch.bool, device=batch.temperature.device)
    if batch.top_k is not None:
        truncates |= batch.top_k > 0
    if batch.top_p is not None:
        truncates |= batch.top_p < 1.0
    return truncates.nonzero().squeeze(1)


def _apply_truncation(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """min-p, then top-k, then top-p over what is left (vLLM's order: top-p's mass is what min-p and
    top-k kept); masked entries become -inf."""
    if batch.min_p is not None:
        probs = logits.softmax(dim=-1)
        floor = batch.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    rows = _truncating_rows(batch)
    if rows.numel():
        sorted_logits, order = logits.index_select(0, rows).sort(dim=-1, descending=True)
        remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if batch.top_k is not None:
            ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
            k = batch.top_k.index_select(0, rows).unsqueeze(1)
            remove |= (k > 0) & (ranks >= k)
        if batch.top_p is not None:
            probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            remove |= mass_before > batch.top_p.index_select(0, rows).unsqueeze(1)
        remove[:, 0] = False
        logits = logits.clone()
        logits[rows] = logits[rows].scatter(1, order, sorted_logits.masked_fill(remove, float("-inf")))
    return logits


def _gather_logprobs(raw_logits: torch.Tensor, tokens: torch.Tensor, batch: SamplingBatch) -> list:
    """Per row: None, or (its token's logprob, top ids, top logprobs). Only the rows that asked are
    normalized: one request with logprobs among 64 rows had cost a [64, V] log-softmax, ~10 ms a step on a
    2-core AMX Xeon."""
    rows = [row for row, k in enumerate(batch.num_logprobs) if k is not None]
    if not rows:
        return [None] * len(batch.num_logprobs)
    index = torch.tensor(rows, dtype=torch.long, device=raw_logits.device)
    logprobs = raw_logits.index_select(0, index).float().log_softmax(dim=-1)
    chosen_ids = tokens.to(raw_logits.device).index_select(0, index)
    chosen = logprobs.gather(1, chosen_ids.unsqueeze(1)).squeeze(1).tolist()
    max_k = max(batch.num_logprobs[row] for row in rows)
    if max_k:
        top_values, top_ids = logprobs.topk(max_k, dim=-1)
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
    result: list = [None] * len(batch.num_logprobs)
    for i, row in enumerate(rows):
        k = batch.num_logprobs[row]
        result[row] = (chosen[i], top_ids[i][:k], top_values[i][:k]) if k else (chosen[i], [], [])
    return result


def gather_prompt_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, num_top: int
) -> list[tuple[float, int, list[int], list[float]]]:
    """Per row: the target token's logprob under the raw logits, its rank (vLLM's: how many tokens are at
    least as likely, itself included, so a tie ranks it last among its equals and a rank of at most k means
    it is among the top k) and the top `num_top` (ids, logprobs), best first."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, targets.unsqueeze(1))
    ranks = (logprobs >= chosen).sum(dim=-1).tolist()
    if num_top:
        top_values, top_ids = logprobs.topk(num_top, dim=-1)
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
    else:
        top_values = top_ids = [[] for _ in ranks]
    chosen = chosen.squeeze(1).tolist()
    return list(zip(chosen, ranks, top_ids, top_values, strict=True))


def allocate_bitmask(num_rows: int, vocab_size: int) -> np.ndarray:
    """One row of int32 words per constrained request; bit i of word w allows token 32w + i."""
    return np.zeros((num_rows, (vocab_size + 31) // 32), dtype=np.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: np.ndarray, rows: list[int] | None = None) -> None:
    """Set every token whose bit is 0 to -inf in place: logits row rows[i] (default i) by bitmask row i.

    On the CPU this runs in numpy: a few small torch element-wise ops cost more than the mask itself
    (each is a trip through the intra-op thread pool, slow whenever another process holds a core).
    """
    rows = list(range(len(bitmask))) if rows is None else rows
    vocab = logits.shape[1]
    # Little-endian words: byte 4w + i // 8, bit i % 8 (lowest first) is token 32w + i.
    forbidden = np.unpackbits(bitmask.view(np.uint8), axis=-1, bitorder="little")[:, :vocab] == 0
    if logits.device.type == "cpu" and logits.is_contiguous():
        view = logits.numpy()
        for i, row in enumerate(rows):
            np.copyto(view[row], -np.inf, where=forbidden[i])
        return
    index = torch.tensor(rows, device=logits.device)
    mask = torch.from_numpy(forbidden).to(logits.device)
    logits[index] = logits[index].masked_fill(mask, float("-inf"))


def _apply_grammars(logits: torch.Tensor, grammars: list[tuple[int, object]]) -> None:
    """Mask the constrained rows only: each grammar writes its row of the bitmask, then they are applied."""
    bitmask = allocate_bitmask(len(grammars), logits.shape[1])
    for i, (_, grammar) in enumerate(grammars):
        grammar.fill_bitmask(bitmask, i)
    apply_bitmask(logits, bitmask, [row for row, _ in grammars])


def _uniforms(batch: SamplingBatch, device: torch.device) -> torch.Tensor:
    """One number in (0, 1) per row: a seeded row's from its own generator, the others' in one call. Kept
    above 0, so that a token of probability 0 is never drawn."""
    uniforms = torch.rand(len(batch.generators), device=device)
    for row, generator in enumerate(batch.generators):
        if generator is not None:
            uniforms[row] = torch.rand(1, generator=generator, device=generator.device)[0]
    return uniforms.clamp_(min=2.0**-30)


def _draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row from its distribution: each row's uniform against its running sum (exact
    sampling; the exponential-race draw it replaces needed one exponential per vocabulary entry, ~30 ms per
    step at 32 rows x 49k on a 2-core AVX512-BF16 EPYC, about as long as the forward pass)."""
    cdf = probs.cumsum(dim=-1)
    u = uniforms.to(cdf.dtype).unsqueeze(1)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(1).clamp_(max=probs.shape[1] - 1)


def _native_draw(logits: torch.Tensor, batch: SamplingBatch, uniforms: torch.Tensor) -> torch.Tensor:
    """Greedy rows' argmax and the other rows' inverse-CDF draw at their temperature, after their top-k,
    top-p and min-p, in the model's dtype (worker/kernels/sampling.cpp): the torch path's six [B, V] passes
    were ~22 ms a step at 64 rows, and its truncation sort ~1.6 ms a row. For rows with nothing else to apply
    to their logits first (`SamplingBatch.logits_as_is`), or with those changes made (`_changed_logits`)."""
    inv_temperature = torch.where(batch.greedy, 0.0, batch.temperature.reciprocal()).float().contiguous()
    tokens = torch.empty(logits.shape[0], dtype=torch.long)
    top_p = None if batch.top_p is None else batch.top_p.float().contiguous()
    top_k = None if batch.top_k is None else batch.top_k.long().contiguous()
    min_p = None if batch.min_p is None else batch.min_p.float().contiguous()
    ops = native_op("sample_rows")
    ops.sample_rows(logits.contiguous(), inv_temperature, uniforms.contiguous(), tokens, top_p, top_k, min_p)
    return tokens


def _changed_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Float32 copies of the rows with bias, penalties, bans, allowed tokens and grammars applied: what both
    draws start from for rows that are not drawn from their logits as they are. The bias goes before the
    penalties, as in vLLM's sampler (the repetition penalty scales a biased logit)."""
    logits = logits.float().clone()
    for row, ids, biases in batch.logit_bias:
        logits[row, ids] += torch.tensor(biases, device=logits.device)
    _apply_penalties(logits, batch)
    for row, ids in batch.allowed:  # every other token masked (vLLM's allowed_token_ids)
        keep = torch.full_like(logits[row], float("-inf"))
        index = torch.tensor(ids, dtype=torch.long, device=logits.device)
        keep[index] = logits[row, index]
        logits[row] = keep
    if batch.grammars:
        _apply_grammars(logits, batch.grammars)
    constrained = {row for row, _ in batch.grammars}
    for row, ids in batch.banned:
        index = torch.tensor(ids, dtype=torch.long, device=logits.device)
        kept = logits[row, index].clone() if row in constrained else None
        logits[row, index] = float("-inf")
        if kept is not None and not torch.isfinite(logits[row]).any():
            # The grammar is complete and allows only its end: that ends the output before min_tokens
            # (the scheduler stops on it), rather than a draw from nothing.
            logits[row, index] = kept
    return logits


def _torch_draw(logits: torch.Tensor, batch: SamplingBatch, uniforms: torch.Tensor) -> torch.Tensor:
    """Penalties, bias, bans and grammars on float32 logits, then greedy rows' argmax and the others'
    draw after temperature and truncation, on torch ops (any device)."""
    logits = _changed_logits(logits, batch)
    if batch.all_greedy:
        return logits.argmax(dim=-1)
    greedy_tokens = logits.argmax(dim=-1)
    logits = _apply_truncation(logits / batch.temperature.unsqueeze(1), batch)
    return torch.where(batch.greedy, greedy_tokens, _draw(logits.softmax(dim=-1), uniforms))


def sample(logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
    """logits: [B, V] (float32, or the model's dtype) for the rows that produce a token this step."""
    uniforms = _uniforms(batch, logits.device)
    if logits.device.type != "cpu" or native_op("sample_rows") is None:
        tokens = _torch_draw(logits, batch, uniforms)
    elif all(batch.logits_as_is):
        tokens = _native_draw(logits, batch, uniforms)
    else:  # the changed rows on float32 copies, each kind on its own, so a row's draw is its own
        as_is = [row for row, ok in enumerate(batch.logits_as_is) if ok]
        changed = [row for row, ok in enumerate(batch.logits_as_is) if not ok]
        tokens = torch.empty(logits.shape[0], dtype=torch.long)
        for rows, change in ((as_is, False), (changed, True)):
            if not rows:
                continue
            index = torch.tensor(rows, dtype=torch.long)
            part, rows_logits = batch.select(rows), logits.index_select(0, index)
            if change:
                rows_logits = _changed_logits(rows_logits, part)
            tokens[index] = _native_draw(rows_logits, part, uniforms[index])
    return SamplerOutput(tokens.tolist(), _gather_logprobs(logits, tokens, batch))
