"""The whole-step decode op (worker/kernels/decode_layers.cpp, worker/model/decode_layers.py) against the
per-layer native path it replaces (worker/model/model.py `_forward_native`), on the same weights, for every
linear kernel the op chains: int4 and int8 (float32), the AMX tile kernel (bfloat16), the w8a8 and w4a8
integer GEMMs and oneDNN's prepacked GEMM (float32 and bfloat16, past 32 rows at its padded shapes).

Both chain the same kernels on the same values, so logits and the K/V written to the pools agree to float
tolerance (in practice exactly). Decode steps run sequences of different lengths whose new tokens land on
every slot of a block, the first slot of a fresh block included.
"""

from __future__ import annotations

import pytest
import torch

from common.linear import amx_available, onednn_available
from tests.engine.factories import drive, make_request, make_scheduler, tiny_llama
from worker.kernels import native_ops
from worker.model.decode_layers import DecodeLayers
from worker.model.model import LlamaForPagedAttention
from worker.model.runner import ModelRunner
from worker.model.w4a8 import w4a8_available
from worker.model.w8a8 import w8a8_available

BLOCK = 4
NUM_BLOCKS = 256  # 40 sequences of up to 20 tokens in blocks of 4
TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(autouse=True)
def _kernels():
    ops = native_ops()
    if ops is None or not hasattr(ops, "decode_layers") or not hasattr(ops, "int4_linear"):
        pytest.skip("native kernels not built, or built before decode_layers (make kernels)")


def head_dim_64_llama() -> torch.nn.Module:
    """Three layers with SmolLM2's head size and grouping (head_dim 64, 3 query heads per KV head), so
    attention takes the kernel's vectorized path; tiny_llama's head_dim 16 takes the generic one."""
    return tiny_llama(
        seed=3,
        hidden_size=192,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=1,
    )


HF_MODELS = {"tiny": tiny_llama, "head_dim_64": head_dim_64_llama}


# case -> (quantization, activation dtype, linear backend, the op's kernel for it)
CASES = {
    "int4": ("int4", torch.float32, "auto", "int4"),
    "int8": ("int8", torch.float32, "auto", "int8"),
    "amx-bf16": ("none", torch.bfloat16, "amx", "amx"),
    "w8a8-bf16": ("w8a8", torch.bfloat16, "auto", "w8a8"),
    "w4a8": ("w4a8", torch.float32, "auto", "w4a8"),
    "onednn-bf16": ("none", torch.bfloat16, "onednn", "onednn"),
    "onednn-fp32": ("none", torch.float32, "onednn", "onednn"),
}


def skip_unless_runs_here(case: str) -> None:
    quantization, dtype, backend, _ = CASES[case]
    probe = torch.zeros(32, 32, dtype=dtype)
    if backend == "amx" and not amx_available(probe):
        pytest.skip("no AMX tiles on this CPU or build")
    if backend == "onednn" and not onednn_available(probe):
        pytest.skip(f"oneDNN has no {dtype} GEMM on this CPU")
    if quantization == "w8a8" and not w8a8_available(torch.device("cpu")):
        pytest.skip("no AVX512-VNNI on this CPU or build")
    if quantization == "w4a8" and not w4a8_available(torch.device("cpu")):
        pytest.skip("no AVX2 on this CPU or build")


def runner_for(hf_name: str, case: str) -> ModelRunner:
    skip_unless_runs_here(case)
    quantization, dtype, backend, kernel = CASES[case]
    hf = HF_MODELS[hf_name]().to(dtype)
    model = LlamaForPagedAttention(hf, max_positions=512, linear_backend=backend, quantization=quantization)
    runner = ModelRunner(model, NUM_BLOCKS, BLOCK, attention_backend="native")
    assert model.decode_layers is not None and model.decode_layers.linear == kernel
    return runner


def prompts(num_seqs: int) -> list[list[int]]:
    # Lengths 4, 7, 13, 2, ...: the first decode tokens land at slots 0, 3, 1, 2 of a block, later ones
    # elsewhere; 40 sequences take oneDNN past its exact row counts, to a padded shape.
    lengths = ([4, 7, 13, 2] * 10)[:num_seqs]
    return [[(11 * i + 5 * n + 3 * j) % 250 + 1 for i in range(n)] for j, n in enumerate(lengths)]


def clone_pools(pools: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(k.clone(), v.clone()) for k, v in pools]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("hf_name", sorted(HF_MODELS))
@pytest.mark.parametrize("num_seqs", [1, 4, 40])
def test_decode_steps_match_the_per_layer_native_path(case, hf_name, num_seqs, monkeypatch):
    runner = runner_for(hf_name, case)
    model = runner.model
    calls = []
    run = DecodeLayers.run
    monkeypatch.setattr(DecodeLayers, "run", lambda self, *a: calls.append(1) or run(self, *a))
    scheduler = make_scheduler(
        num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_batched_tokens=512, max_num_seqs=num_seqs
    )
    for prompt in prompts(num_seqs):
        scheduler.add_request(make_request(prompt=prompt, max_tokens=7))
    decode_steps = 0
    while scheduler.num_unfinished:
        plan = scheduler.schedule()
        inputs = runner.prepare(plan)
        decoding = model.decode_layers.applies(inputs.meta, len(inputs.input_ids))
        args = (inputs.input_ids, inputs.positions, inputs.meta)
        expected_pools = clone_pools(runner.kv_caches)
        model.use_decode_layers = False
        expected = model.forward(*args, expected_pools, inputs.logits_indices)
        model.use_decode_layers = True
        before = len(calls)
        logits = model.forward(*args, runner.kv_caches, inputs.logits_indices)
        assert len(calls) - before == int(decoding), "the op runs on decode-only steps, and only there"
        decode_steps += decoding
        torch.testing.assert_close(logits, expected, **TOL)
        for (k, v), (expected_k, expected_v) in zip(runner.kv_caches, expected_pools, strict=True):
            torch.testing.assert_close(k, expected_k, **TOL)
            torch.testing.assert_close(v, expected_v, **TOL)
        tokens = logits.argmax(dim=-1).tolist()
        sampled = {r.request_id: t for r, t in zip(inputs.sampling_requests, tokens, strict=True)}
        scheduler.update_from_output(plan, sampled)
    assert decode_steps >= 6


def greedy_outputs(case: str, use_decode_layers: bool) -> list[list[int]]:
    runner = runner_for("head_dim_64", case)
    runner.model.use_decode_layers = use_decode_layers
    scheduler = make_scheduler(num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_batched_tokens=16)
    requests = [make_request(prompt=p, max_tokens=12) for p in prompts(4)]
    for request in requests:
        scheduler.add_request(request)
    drive(scheduler, runner)
    return [r.all_token_ids[r.num_prompt_tokens :] for r in requests]


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_greedy_tokens_are_the_same_with_the_op_and_without(case):
    with_op = greedy_outputs(case, True)
    assert all(len(tokens) == 12 for tokens in with_op)
    assert with_op == greedy_outputs(case, False)


def test_models_the_op_does_not_cover_keep_the_per_layer_path():
    hf = tiny_llama()
    assert LlamaForPagedAttention(hf, 512, quantization="int8").decode_layers is None  # no native use yet
    plain = LlamaForPagedAttention(hf, 512, linear_backend="torch")
    assert ModelRunner(plain, NUM_BLOCKS, BLOCK, attention_backend="native").model.decode_layers is None
    bf16 = LlamaForPagedAttention(tiny_llama().to(torch.bfloat16), 512, quantization="int8")
    bf16_runner = ModelRunner(bf16, NUM_BLOCKS, BLOCK, attention_backend="native")
    assert bf16_runner.model.decode_layers is None  # the int8 kernel takes float32 rows
    torch_runner = ModelRunner(
        LlamaForPagedAttention(hf, 512, quantization="int8"), NUM_BLOCKS, BLOCK, attention_backend="torch"
    )
    assert torch_runner.model.decode_layers is None  # no native ops at all
    biased = LlamaForPagedAttention(tiny_llama(attention_bias=True), 512, quantization="int8")
    assert ModelRunner(biased, NUM_BLOCKS, BLOCK, attention_backend="native").model.decode_layers is None


def test_the_op_refuses_inconsistent_inputs():
    runner = runner_for("tiny", "int8")
    fused = runner.model.decode_layers
    hidden = torch.zeros(1, runner.model.shape.hidden_size)
    pools = runner.kv_caches
    k_caches, v_caches = [k for k, _ in pools], [v for _, v in pools]
    args = [torch.zeros(1, dtype=torch.long), runner.model.cos, runner.model.sin, k_caches, v_caches]
    meta = [torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long)]
    weights = [fused.input_norms, fused.post_norms, fused.qkv, fused.o_proj, fused.gate_up, fused.down]
    shape = [fused.num_heads, fused.num_kv_heads]

    def call(slot: int, linear: str, rows: int = 1, rows_dtype: torch.dtype = torch.float32) -> None:
        slots = torch.tensor([slot])
        x = hidden.to(rows_dtype)
        fused.ops.decode_layers(
            x, torch.empty_like(x), *args, *meta, slots, *weights, *shape, linear, rows, fused.eps
        )

    call(0, "int8")
    with pytest.raises(RuntimeError, match="slot out of range"):
        call(NUM_BLOCKS * BLOCK, "int8")
    with pytest.raises(RuntimeError, match="3 tensors per layer"):
        call(0, "int4")  # int8 lists given as int4
    with pytest.raises(RuntimeError, match="linear is int4, int8, amx, w8a8, w4a8 or onednn"):
        call(0, "int2")
    with pytest.raises(RuntimeError, match="only onednn linears run at more rows"):
        call(0, "int8", rows=16)
    with pytest.raises(RuntimeError, match="take float32 rows"):
        call(0, "int8", rows_dtype=torch.bfloat16)
