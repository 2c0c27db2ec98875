"""The whole-step decode op (worker/kernels/decode_layers.cpp, worker/model/decode_layers.py) against the
per-layer native path it replaces (worker/model/model.py `_forward_native`), on the same quantized weights.

Both chain the same kernels on the same values, so logits and the K/V written to the pools agree to float
tolerance (in practice exactly). Decode steps run sequences of different lengths whose new tokens land on
every slot of a block, the first slot of a fresh block included.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.factories import drive, make_request, make_scheduler, tiny_llama
from worker.kernels import native_ops
from worker.model.decode_layers import DecodeLayers
from worker.model.model import LlamaForPagedAttention
from worker.model.runner import ModelRunner
from worker.model.w8a8 import w8a8_available

BLOCK = 4
NUM_BLOCKS = 64
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


def runner_for(hf_name: str, quantization: str) -> ModelRunner:
    model = LlamaForPagedAttention(HF_MODELS[hf_name](), max_positions=512, quantization=quantization)
    runner = ModelRunner(model, NUM_BLOCKS, BLOCK, attention_backend="native")
    expected_bits = 4 if quantization == "int4" else 8
    assert model.decode_layers is not None and model.decode_layers.weight_bits == expected_bits
    return runner


def prompts(num_seqs: int) -> list[list[int]]:
    # Lengths 4, 7, 13, 2: the first decode tokens land at slots 0, 3, 1, 2 of a block, later ones elsewhere.
    lengths = [4, 7, 13, 2][:num_seqs]
    return [[(11 * i + 5 * n) % 250 + 1 for i in range(n)] for n in lengths]


def clone_pools(pools: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(k.clone(), v.clone()) for k, v in pools]


@pytest.mark.parametrize("quantization", ["int4", "int8"])
@pytest.mark.parametrize("hf_name", sorted(HF_MODELS))
@pytest.mark.parametrize("num_seqs", [1, 4])
def test_decode_steps_match_the_per_layer_native_path(quantization, hf_name, num_seqs, monkeypatch):
    runner = runner_for(hf_name, quantization)
    model = runner.model
    calls = []
    run = DecodeLayers.run
    monkeypatch.setattr(DecodeLayers, "run", lambda self, *a: calls.append(1) or run(self, *a))
    scheduler = make_scheduler(num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_batched_tokens=64)
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


def greedy_outputs(quantization: str, use_decode_layers: bool) -> list[list[int]]:
    runner = runner_for("head_dim_64", quantization)
    runner.model.use_decode_layers = use_decode_layers
    scheduler = make_scheduler(num_blocks=NUM_BLOCKS, block_size=BLOCK, max_num_batched_tokens=16)
    requests = [make_request(prompt=p, max_tokens=12) for p in prompts(4)]
    for request in requests:
        scheduler.add_request(request)
    drive(scheduler, runner)
    return [r.all_token_ids[r.num_prompt_tokens :] for r in requests]


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_engine_greedy_tokens_are_the_same_with_the_op_and_without(quantization):
    with_op = greedy_outputs(quantization, True)
    assert all(len(tokens) == 12 for tokens in with_op)
    assert with_op == greedy_outputs(quantization, False)


def test_models_the_op_does_not_cover_keep_the_per_layer_path():
    hf = tiny_llama()
    assert LlamaForPagedAttention(hf, 512, quantization="none").decode_layers is None  # no native use yet
    float_runner = ModelRunner(LlamaForPagedAttention(hf, 512), NUM_BLOCKS, BLOCK, attention_backend="native")
    assert float_runner.model.decode_layers is None  # float linears
    bf16 = LlamaForPagedAttention(tiny_llama().to(torch.bfloat16), 512, quantization="int8")
    bf16_runner = ModelRunner(bf16, NUM_BLOCKS, BLOCK, attention_backend="native")
    assert bf16_runner.model.decode_layers is None  # float32 only
    torch_runner = ModelRunner(
        LlamaForPagedAttention(hf, 512, quantization="int8"), NUM_BLOCKS, BLOCK, attention_backend="torch"
    )
    assert torch_runner.model.decode_layers is None  # no native ops at all
    if w8a8_available(torch.device("cpu")):  # the project's integer GEMM: not chained by the op
        w8a8_model = LlamaForPagedAttention(hf, 512, quantization="w8a8")
        w8a8_runner = ModelRunner(w8a8_model, NUM_BLOCKS, BLOCK, attention_backend="native")
        assert w8a8_runner.model.decode_layers is None


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

    def call(slot: int, bits: int) -> None:
        slots = torch.tensor([slot])
        fused.ops.decode_layers(
            hidden, torch.empty_like(hidden), *args, *meta, slots, *weights, *shape, bits, fused.eps
        )

    call(0, 8)
    with pytest.raises(RuntimeError, match="slot out of range"):
        call(NUM_BLOCKS * BLOCK, 8)
    with pytest.raises(RuntimeError, match="3 tensors per layer"):
        call(0, 4)  # int8 lists given as int4
