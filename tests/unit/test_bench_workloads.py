"""The peer benchmark's workloads draw prompts of their own: vLLM's random dataset gives the same prompts for
one seed whatever their number, so a shared seed replays earlier prompts into a server's prefix cache."""

from __future__ import annotations

from bench.peer_bench import runs, workload_seed


def seed_of(args: list[str]) -> str:
    return args[args.index("--seed") + 1]


def test_every_workload_and_the_warm_up_have_a_seed_of_their_own() -> None:
    for quick in (False, True):
        seeds = [seed_of(run.args) for run in runs(quick, c1_prompts=16)] + [seed_of(workload_seed("warmup"))]
        assert len(seeds) == len(set(seeds)) == 6, seeds
        assert all(run.args.count("--seed") == 1 for run in runs(quick))
