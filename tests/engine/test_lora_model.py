"""LoRA adapters made with peft on the bundled SmolLM2-135M-Instruct: the engine's greedy output with each
adapter equals transformers + peft's, token for token, with several adapters and the base model in one
batch through the scheduler, preemption and prefix caching on; the refusals; the quantized and bfloat16
paths."""

from __future__ import annotations

import pytest
import torch

from common.linear import Linear, amx_available
from tests.engine.factories import paged_runner, tiny_llama
from tests.support.lora_adapters import MODEL_DIR, edit_config, load_base, make_adapter
from worker.engine.config import EngineConfig, KVCacheConfig, SchedulerConfig
from worker.engine.lora_config import LoraConfig
from worker.engine.outputs import PromptInput
from worker.engine.sampling_params import SamplingParams
from worker.model.build import build_engine
from worker.model.lora.adapter import LoraAdapterError
from worker.model.lora.layers import LoraLinear, LoraStepContext
from worker.model.lora.manager import LoraManager
from worker.model.quant import build_linear

MAX_NEW = 12
QUESTIONS = [
    "What is the capital of France? Answer in one short sentence, please, and then say why it matters.",
    "Name three primary colors.",
]
# name -> (seed, target modules, lora_alpha): strong enough that each moves the greedy output early
ADAPTERS = {
    "all": (1, None, 32),
    "attn-qv": (2, ["q_proj", "v_proj"], 96),
    "mlp": (3, ["gate_proj", "up_proj", "down_proj"], 48),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a CPU shared with other work, two spinning threads ran steps many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    base = load_base()
    return {
        name: make_adapter(str(root / name), seed, targets, base=base, lora_alpha=alpha)
        for name, (seed, targets, alpha) in ADAPTERS.items()
    }


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in QUESTIONS
    ]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


@pytest.fixture(scope="module")
def reference(adapters, prompts) -> dict[str | None, list[list[int]]]:
    """transformers + peft's greedy continuations, per adapter (None: the base model) and prompt."""
    from peft import PeftModel

    out = {}
    for name in [None, *adapters]:
        model = load_base()
        if name is not None:
            model = PeftModel.from_pretrained(model, adapters[name]).eval()
        with torch.no_grad():
            out[name] = [
                model.generate(input_ids=torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False)[
                    0, len(p) :
                ].tolist()
                for p in prompts
            ]
    return out


def _engine(adapters: dict[str, str], num_blocks: int = 400, dtype: str = "float32", **lora: object):
    modules = ",".join(f"{n}={p}" for n, p in adapters.items())
    config = EngineConfig(
        model=MODEL_DIR,
        dtype=dtype,
        quantization=lora.pop("quantization", "none"),
        scheduler=SchedulerConfig(max_num_batched_tokens=48, max_num_seqs=16, max_model_len=512),
        kv_cache=KVCacheConfig(block_size=16, num_blocks=num_blocks, enable_prefix_caching=True),
        lora=LoraConfig(lora_modules=modules, **{"max_loras": len(adapters) or 1, **lora}),
    )
    return build_engine(config)


def _run(engine, jobs: list[tuple[str | None, list[int]]]) -> list[list[int]]:
    """Greedy outputs of every (adapter, prompt) job, all added at once and stepped to the end."""
    requests = []
    for i, (name, prompt) in enumerate(jobs):
        ref = engine.lora.registry.resolve(name) if name else None
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        [request] = engine.make_requests(f"job-{i}", PromptInput(token_ids=prompt), params, ref)
        engine.add([request])
        requests.append(request)
    while engine.has_unfinished():
        engine.step()
    return [r.output_token_ids for r in requests]


def test_adapters_and_base_in_one_batch_equal_peft_token_for_token_with_preemption_and_prefix_cache(
    adapters, prompts, reference
):
    # 10 blocks of 16 tokens cannot hold the 10 sequences at once: requests are preempted and recomputed.
    engine = _engine(adapters, num_blocks=10, max_loras=2, max_cpu_loras=2)
    names: list[str | None] = [None, *adapters]
    jobs = [(name, prompt) for name in names for prompt in prompts]
    jobs += [(None, prompts[0]), ("all", prompts[0])]  # the same prompt again: prefix-cache hits
    outputs = _run(engine, jobs)
    for (name, prompt), got in zip(jobs, outputs, strict=True):
        want = reference[name][prompts.index(prompt)]
        n = min(len(want), len(got))  # transformers stops at EOS; ignore_eos runs on
        assert got[:n] == want[:n], (name, prompt[:5])
    assert engine.scheduler.num_preemptions > 0
    assert engine.scheduler.block_manager.prefix_hits > 0
    assert engine.lora.registry.num_loads > len(adapters)  # max_cpu_loras 2 < 3 adapters: some reloaded
    for i in range(len(prompts)):  # each adapter changes the output, and differently
        continuations = [tuple(reference[name][i]) for name in names]
        assert len(set(continuations)) == len(names)


def test_refusals_name_the_reason(tmp_path, adapters):
    base = load_base()
    engine = _engine({}, enabled=True, max_lora_rank=16)
    registry = engine.lora.registry
    cases = {
        "rank 32 is above the maximum LoRA rank 16": make_adapter(str(tmp_path / "r32"), 4, r=32, base=base),
        "target modules \\['lm_head'\\]": make_adapter(
            str(tmp_path / "head"), 5, ["q_proj", "lm_head"], base=base
        ),
        "embed_tokens": make_adapter(str(tmp_path / "emb"), 6, ["embed_tokens"], base=base),
    }
    dora = str(tmp_path / "dora")
    make_adapter(dora, 7, ["q_proj"], base=base)
    edit_config(dora, use_dora=True)
    cases["DoRA"] = dora
    other = str(tmp_path / "other")
    make_adapter(other, 8, ["q_proj"], base=base)
    edit_config(other, base_model_name_or_path="meta-llama/Llama-3.2-1B")
    cases["trained on 'meta-llama/Llama-3.2-1B'"] = other
    saved = str(tmp_path / "saved")
    make_adapter(saved, 9, ["q_proj"], base=base, modules_to_save=["lm_head"])
    cases["modules_to_save"] = saved
    cases["no adapter_config.json"] = str(tmp_path)
    for reason, path in cases.items():
        with pytest.raises(LoraAdapterError, match=reason):
            registry.add(f"bad-{abs(hash(reason))}", path)
    assert registry.refs() == []
    registry.add("fine", adapters["attn-qv"])  # the same engine still takes a good one
    assert [r.name for r in registry.refs()] == ["fine"]


def test_an_adapter_in_weights_of_another_shape_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    path = make_adapter(str(tmp_path / "shape"), 10, ["q_proj"])
    weights = load_file(f"{path}/adapter_model.safetensors")
    key = next(k for k in weights if "lora_A" in k)
    weights[key] = torch.zeros(8, 1024)  # as if trained on a model 1024 wide
    save_file(weights, f"{path}/adapter_model.safetensors")
    engine = _engine({}, enabled=True)
    with pytest.raises(LoraAdapterError, match="do not fit this model"):
        engine.lora.registry.add("wide", path)


def test_decode_graphs_refuse_lora_at_start():
    runner = paged_runner(tiny_llama(), num_blocks=16, block_size=4, decode_graphs="eager", max_num_seqs=4)
    manager = object.__new__(LoraManager)
    with pytest.raises(ValueError, match="WORKER_ENFORCE_EAGER"):
        runner.use_lora(manager)


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_lora_over_each_linear_kind_adds_exactly_its_low_rank_product(quantization):
    torch.manual_seed(0)
    weight = torch.randn(96, 64) * 0.1
    base = build_linear(weight, None, "auto", quantization)
    context = LoraStepContext()
    layer = LoraLinear(base, 0, "qkv", context)
    x = torch.randn(5, 64)
    a1, b1, a2, b2 = torch.randn(4, 64), torch.randn(96, 4), torch.randn(8, 64), torch.randn(96, 8)

    class Adapter:  # the shape LoraLinear reads: layers[i][projection].a / .b
        def __init__(self, a, b):
            self.layers = [{"qkv": type("W", (), {"a": a, "b": b})()}]

    rows1, rows2 = torch.tensor([1, 3]), torch.tensor([0, 4])  # row 2: the base model
    context.set(5, [(Adapter(a1, b1), rows1), (Adapter(a2, b2), rows2)])
    got = layer(x)
    want = base(x).clone()
    want[rows1] += (x[rows1] @ a1.T) @ b1.T
    want[rows2] += (x[rows2] @ a2.T) @ b2.T
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(
    not amx_available(torch.zeros(32, 32, dtype=torch.bfloat16)),
    reason="the one-pass activation runs on AMX tiles",
)
def test_gate_up_takes_the_one_pass_activation_only_on_steps_without_adapter_rows():
    torch.manual_seed(0)
    base = Linear((torch.randn(64, 96) * 0.1).bfloat16(), backend="amx")
    context = LoraStepContext()
    layer = LoraLinear(base, 0, "gate_up", context)
    x = torch.randn(3, 96).bfloat16()
    context.set(3, [])
    assert torch.equal(layer.silu_and_mul(x), base.silu_and_mul(x))

    class Adapter:  # the shape LoraLinear reads: layers[i][projection].a / .b
        layers = [{"gate_up": type("W", (), {"a": torch.randn(4, 96), "b": torch.randn(64, 4)})()}]

    context.set(3, [(Adapter(), None)])  # its product goes between the projection and the activation
    assert layer.silu_and_mul(x) is None


def test_int8_engine_serves_adapters_and_each_changes_its_output(adapters, prompts):
    engine = _engine(adapters, quantization="int8")
    assert engine.runner.model.decode_layers is None  # the fused decode op reads base weights only
    names: list[str | None] = [None, *adapters]
    outputs = _run(engine, [(name, prompts[0]) for name in names])
    assert len({tuple(o) for o in outputs}) == len(names)


def test_bfloat16_engine_adds_the_same_adapter_update_as_peft(adapters, prompts):
    """Prompt logits in bfloat16: (adapter - base) follows peft's float32 (adapter - base) closely."""
    from peft import PeftModel

    engine = _engine({"all": adapters["all"]}, dtype="bfloat16")
    prompt = prompts[0]

    def engine_logits(name):
        ref = engine.lora.registry.resolve(name) if name else None
        [request] = engine.make_requests(
            f"logits-{name}", PromptInput(token_ids=prompt), SamplingParams(), ref
        )
        engine.add([request])
        done = 0
        while True:  # the prompt may run in chunks (48 tokens a step): its last row is the last chunk's
            plan = engine.scheduler.schedule()
            _, logits = engine.runner.all_logits(plan)
            done += plan.scheduled[0].num_new_tokens
            if done >= len(prompt):
                break
            request.num_computed_tokens = done
        engine.abort(request.group_id)
        return logits[-1]

    with torch.no_grad():
        hf = load_base()
        want_base = hf(torch.tensor([prompt])).logits[0, -1]
        peft_model = PeftModel.from_pretrained(hf, adapters["all"]).eval()
        want_lora = peft_model(torch.tensor([prompt])).logits[0, -1]
    got_delta = engine_logits("all") - engine_logits(None)
    want_delta = want_lora - want_base
    cosine = torch.nn.functional.cosine_similarity(got_delta, want_delta, dim=0)
    assert want_delta.abs().max() > 0.5  # the adapter moves the logits
    assert cosine > 0.97


def test_an_adapter_that_cannot_be_reloaded_aborts_its_requests_and_the_rest_go_on(
    tmp_path, adapters, prompts
):
    import shutil

    from worker.engine.request import RequestStatus

    path = shutil.copytree(adapters["mlp"], tmp_path / "mlp")
    engine = _engine({"gone": str(path)})
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    [base] = engine.make_requests("base", PromptInput(token_ids=prompts[1]), params)
    ref = engine.lora.registry.resolve("gone")
    [lora] = engine.make_requests("lora", PromptInput(token_ids=prompts[1]), params, ref)
    engine.add([base])
    engine.add([lora])
    engine.step()
    engine.lora.registry.remove("gone")  # unloaded while it runs: reloaded from its path...
    shutil.rmtree(path)  # ...which is gone
    while engine.has_unfinished():
        engine.step()
    assert lora.status == RequestStatus.FINISHED_ABORTED
    assert base.status == RequestStatus.FINISHED_LENGTH and base.num_output_tokens == 6
    assert engine.scheduler.block_manager.num_used_blocks == 0
