"""The CUDA-graph decode path (worker/model/decode_graphs.py), run eagerly on the CPU: padded batches, a
scratch block for the padding rows and bucketed block tables must give transformers' logits exactly as the
general path does. On a GPU the same path is captured and replayed (studies/cuda_check.py checks it there)."""

import pytest
import torch

from tests.engine.factories import make_request, paged_runner, tiny_llama
from tests.engine.test_model_vs_transformers import assert_matches_transformers, run_collecting_logits
from worker.model.decode_graphs import batch_buckets, block_buckets, bucket


@pytest.fixture(scope="module")
def hf_model():
    return tiny_llama(seed=3)


def test_buckets_cover_every_size_with_little_padding() -> None:
    sizes = batch_buckets(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256
    assert all(bucket(n, sizes) >= n for n in range(1, 257))
    assert bucket(17, sizes) == 32 and bucket(3, sizes) == 4
    assert batch_buckets(5) == [1, 2, 4, 5] and batch_buckets(1) == [1]
    assert block_buckets(128) == [1, 2, 4, 8, 16, 32, 64, 128] and block_buckets(100)[-2:] == [64, 100]


@pytest.mark.parametrize(
    "max_num_seqs", [8, 3]
)  # 3: five decoding sequences do not fit, the general path runs
def test_padded_decode_gives_transformers_logits(hf_model, max_num_seqs: int) -> None:
    num_blocks, block_size = 96, 4
    runner = paged_runner(
        hf_model,
        num_blocks,
        block_size,
        attention_backend="torch",
        decode_graphs="eager",
        max_num_seqs=max_num_seqs,
    )
    graphs = runner.decode_graphs
    calls = []
    run = graphs.run

    def run_and_record(*args):  # the steps that went through the graphs' path (None: too large for it)
        logits = run(*args)
        if logits is not None:
            calls.append(len(args[0]))
        return logits

    graphs.run = run_and_record
    requests = [make_request(num_prompt_tokens=n, max_tokens=14) for n in (1, 5, 17, 33, 40)]
    logits, _, _ = run_collecting_logits(
        hf_model,
        requests,
        block_size=block_size,
        num_blocks=num_blocks,
        budget=48,
        arrivals=[0, 0, 2, 5, 9],  # batches of every size on the way, contexts past 8 blocks (bucket 16)
        runner=runner,
    )
    assert_matches_transformers(hf_model, requests, logits)
    assert calls, "no step went through the decode graphs' path"
    assert max(calls) <= max_num_seqs
    padded = [n for n in calls if n not in graphs.batch_sizes]
    assert padded or max_num_seqs == 3  # with 8 slots, batches of 3, 5, 6 or 7 are padded
    scratch = runner.kv_caches[0][0][:, num_blocks]
    assert (scratch.abs().sum() > 0) == bool(padded)  # padding rows write only there, past the managed pool


def test_sampling_through_the_decode_path_matches_the_general_path(hf_model) -> None:
    """Seeded sampling, penalties and the greedy rows give the same tokens either way."""
    from tests.engine.factories import drive, make_scheduler

    outputs = []
    for mode in ("off", "eager"):
        runner = paged_runner(hf_model, 64, 4, attention_backend="torch", decode_graphs=mode, max_num_seqs=8)
        scheduler = make_scheduler(num_blocks=64, block_size=4, max_num_batched_tokens=64)
        requests = [
            make_request(num_prompt_tokens=7, max_tokens=10, temperature=0.8, seed=11, top_p=0.9),
            make_request(num_prompt_tokens=9, max_tokens=10, presence_penalty=1.0),
            make_request(num_prompt_tokens=3, max_tokens=10, temperature=1.0, seed=5, top_k=20),
        ]
        for r in requests:
            scheduler.add_request(r)
        drive(scheduler, runner)
        outputs.append([r.output_token_ids for r in requests])
    assert outputs[0] == outputs[1]
    assert torch.tensor([len(o) for o in outputs[0]]).eq(10).all()
