"""Families beside Llama: their weights gathered by worker/model/model.py, checked against transformers.

- Qwen2 (q/k/v biases, tied embeddings) runs on the Llama forward: the paged engine's logits match
  transformers' for a tiny random model.
- Gemma 3 (text): the gathered weights (Gemma's (1 + w) norms and embedding scale folded, q/k norms,
  sandwich norms, local and global rotary tables, sliding window, query_pre_attn_scalar folded into q)
  are checked by `reference_logits`, a plain full-sequence forward over exactly those weights, against
  transformers, and the paged forward (torch attention backend: the native kernels run the Llama layer
  only) against transformers' logits, prompts longer than the window, chunked prefill included.
- Any other architecture is refused before anything loads, naming its type, also by a worker process.
- `models/gemma-3-270m` (`python -m tools.fetch_model --model gemma-3-270m`), when present: the real
  weights through `reference_logits` against transformers' logits and greedy generate.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.engine.factories import make_request
from tests.engine.test_model_vs_transformers import assert_matches_transformers, run_collecting_logits
from worker.model.loader import UnsupportedModelError, check_model_type, load_model
from worker.model.model import FORWARD_FEATURES, LlamaForPagedAttention

GEMMA_DIR = Path("models/gemma-3-270m")


def randomize(model: torch.nn.Module) -> torch.nn.Module:
    """Weights larger than the default init, norms included (Gemma's start at zero)."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08 if p.dim() > 1 else 0.3)
    return model.eval()


def tiny_qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return randomize(Qwen2ForCausalLM(config))


def tiny_gemma3() -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,  # not head_dim: the fold into q is exercised
        sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=512,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    return randomize(Gemma3ForCausalLM(config))


def reference_logits(model: LlamaForPagedAttention, token_ids: list[int]) -> torch.Tensor:
    """The decoder over the gathered weights, whole sequence at once, with every feature a family needs:
    what the paged forward must compute for Gemma 3 (q/k norms, sandwich norms, per-layer rotary,
    sliding window, gelu-tanh)."""
    s = model.shape
    num_tokens, q_size, kv_size = len(token_ids), s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    positions = torch.arange(num_tokens)

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + s.rms_norm_eps)).to(x.dtype)

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    with torch.inference_mode():
        hidden = model.embed[torch.tensor(token_ids)]
        for layer in model.layers:
            cos, sin = layer.rope or (model.cos, model.sin)
            cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
            q, k, v = layer.qkv(norm(hidden, layer.input_norm)).split([q_size, kv_size, kv_size], dim=-1)
            q, k = q.view(num_tokens, s.num_heads, s.head_dim), k.view(num_tokens, s.num_kv_heads, s.head_dim)
            if layer.q_norm is not None:
                q, k = norm(q, layer.q_norm), norm(k, layer.k_norm)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            visible = positions.unsqueeze(0) <= positions.unsqueeze(1)  # [query, key]
            if layer.sliding_window is not None:
                visible &= positions.unsqueeze(0) > positions.unsqueeze(1) - layer.sliding_window
            group = s.num_heads // s.num_kv_heads
            attn = F.scaled_dot_product_attention(
                q.transpose(0, 1),
                k.transpose(0, 1).repeat_interleave(group, 0),
                v.view(num_tokens, s.num_kv_heads, s.head_dim).transpose(0, 1).repeat_interleave(group, 0),
                attn_mask=visible,
            )
            out = layer.o_proj(attn.transpose(0, 1).reshape(num_tokens, q_size))
            if layer.post_attn_norm is not None:
                out = norm(out, layer.post_attn_norm)
            hidden = hidden + out
            gate, up = layer.gate_up(norm(hidden, layer.post_norm)).chunk(2, dim=-1)
            act = F.gelu(gate, approximate="tanh") if model.activation == "gelu_tanh" else F.silu(gate)
            out = layer.down(act * up)
            if layer.post_mlp_norm is not None:
                out = norm(out, layer.post_mlp_norm)
            hidden = hidden + out
        return model.lm_head(norm(hidden, model.final_norm)).float()


def hf_logits(hf_model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].float()


def test_qwen2_runs_on_the_paged_forward() -> None:
    hf_model = tiny_qwen2()
    model = LlamaForPagedAttention(hf_model, max_positions=512, linear_backend="torch")
    assert model.missing_forward_features() == []
    assert hf_model.model.layers[0].self_attn.q_proj.bias is not None  # the biases ride on the fused QKV
    requests = [make_request(num_prompt_tokens=n, max_tokens=6) for n in (5, 19)]
    logits, _, _ = run_collecting_logits(hf_model, requests, block_size=4, num_blocks=64, budget=16)
    assert_matches_transformers(hf_model, requests, logits)


@pytest.mark.parametrize("linear_backend", ["torch", "onednn"])
def test_gemma3_gathered_weights_reproduce_transformers(linear_backend: str) -> None:
    hf_model = tiny_gemma3()
    model = LlamaForPagedAttention(hf_model, max_positions=64, linear_backend=linear_backend)
    assert [layer.sliding_window for layer in model.layers] == [8, 8, None]
    assert model.layers[0].rope is not None and model.layers[2].rope is None  # local tables, then global
    assert model.needs == {"qk_norm", "sandwich_norms", "per_layer_rope", "sliding_window", "gelu_tanh"}
    token_ids = [(13 * i + 7) % 255 + 1 for i in range(21)]  # longer than the window
    torch.testing.assert_close(
        reference_logits(model, token_ids), hf_logits(hf_model, token_ids), rtol=1e-4, atol=1e-4
    )
    # A context no longer than the window never needs it.
    assert "sliding_window" not in LlamaForPagedAttention(hf_model, max_positions=8).needs


def test_gemma3_on_the_paged_forward_or_refused_by_name(tmp_path: Path) -> None:
    hf_model = tiny_gemma3()
    missing = LlamaForPagedAttention(hf_model, max_positions=64).missing_forward_features()
    if missing:
        hf_model.save_pretrained(tmp_path)
        with pytest.raises(UnsupportedModelError, match="does not compute yet: " + ", ".join(missing)):
            load_model(str(tmp_path), "float32", "cpu", 64, "torch")
        pytest.skip(f"the paged forward does not compute {missing} yet (model.py FORWARD_FEATURES)")
    requests = [make_request(num_prompt_tokens=n, max_tokens=6) for n in (5, 19)]
    logits, _, _ = run_collecting_logits(hf_model, requests, block_size=4, num_blocks=64, budget=16)
    assert_matches_transformers(hf_model, requests, logits)


def test_forward_features_are_known_names() -> None:
    assert FORWARD_FEATURES <= {"qk_norm", "sandwich_norms", "per_layer_rope", "sliding_window", "gelu_tanh"}


def test_unsupported_architecture_is_refused_by_name(tmp_path: Path) -> None:
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=r"model type 'gpt2' \(.*\) is not supported.*llama"):
        check_model_type(str(tmp_path))
    env = os.environ | {"WORKER_METRICS_PORT": "0", "WORKER_PORT": "0"}
    worker = subprocess.run(
        [sys.executable, "-m", "worker", "--model", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode != 0
    assert "model type 'gpt2'" in worker.stderr and "is not supported" in worker.stderr


@pytest.mark.skipif(
    not (GEMMA_DIR / "config.json").exists(), reason="python -m tools.fetch_model --model gemma-3-270m"
)
def test_gemma3_270m_weights_against_transformers() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(GEMMA_DIR)
    hf_model = AutoModelForCausalLM.from_pretrained(GEMMA_DIR, dtype=torch.float32).eval()
    model = LlamaForPagedAttention(hf_model, max_positions=128)
    prompt = tokenizer("The capital of France is").input_ids
    torch.testing.assert_close(
        reference_logits(model, prompt), hf_logits(hf_model, prompt), rtol=1e-3, atol=1e-3
    )
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0].tolist()
    tokens = list(prompt)
    for _ in range(8):
        tokens.append(int(reference_logits(model, tokens)[-1].argmax()))
    assert tokens == expected
    # And through the engine's own paged forward (scheduler + runner), greedy == generate.
    request = make_request(prompt=prompt, max_tokens=8)
    run_collecting_logits(hf_model, [request], block_size=16, num_blocks=64, budget=512)
    assert request.all_token_ids == expected
