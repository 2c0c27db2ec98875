"""LoRA bookkeeping without a model: the adapter registry (LRU in memory, reload from the path), the
scheduler's adapters-per-batch limit, the prefix cache keeping adapters apart, the settings' parsing."""

import pytest

from tests.engine.factories import ScriptedRunner, drive, make_request, make_scheduler
from worker.engine.block_manager import BlockManager
from worker.engine.lora_config import LoraConfig
from worker.engine.lora_registry import LoraNotFoundError, LoraRef, LoraRegistry
from worker.engine.request import RequestStatus


class CountingLoader:
    def __init__(self) -> None:
        self.loads: list[tuple[str, str]] = []

    def __call__(self, name: str, path: str) -> dict:
        if path.startswith("bad"):
            raise ValueError(f"{path}: not an adapter")
        self.loads.append((name, path))
        return {"name": name, "path": path}


def test_registry_keeps_the_most_recently_used_and_reloads_the_evicted_from_their_path():
    loader = CountingLoader()
    registry = LoraRegistry(2, loader)
    a, b, c = (registry.add(n, f"/adapters/{n}") for n in "abc")
    assert registry.resident_ids() == [b.lora_id, c.lora_id]  # a was evicted when c came
    assert registry.get(b)["name"] == "b"  # resident: no load
    assert len(loader.loads) == 3
    assert registry.get(a) == {"name": "a", "path": "/adapters/a"}  # reloaded from its path
    assert loader.loads[-1] == ("a", "/adapters/a")
    assert registry.resident_ids() == [b.lora_id, a.lora_id]  # c, least recently used, went
    assert registry.num_loads == 4


def test_registry_refuses_a_taken_name_and_a_bad_adapter_and_ids_are_never_reused():
    registry = LoraRegistry(4, CountingLoader())
    first = registry.add("x", "/adapters/x")
    with pytest.raises(ValueError, match="already loaded"):
        registry.add("x", "/adapters/other")
    with pytest.raises(ValueError, match="not an adapter"):
        registry.add("y", "bad/y")
    assert registry.resolve("y") is None
    assert registry.remove("x") == first
    with pytest.raises(LoraNotFoundError):
        registry.remove("x")
    again = registry.add("x", "/adapters/x2")
    assert again.lora_id != first.lora_id
    assert [r.name for r in registry.refs()] == ["x"]


def test_a_ref_carries_the_digest_of_its_files_the_same_for_a_copy_and_another_for_other_weights(tmp_path):
    from worker.model.lora.adapter import adapter_digest

    for name, weights in (("a", b"weights-a"), ("copy", b"weights-a"), ("b", b"weights-b")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text('{"r": 8}')
        (tmp_path / name / "adapter_model.safetensors").write_bytes(weights)
    registry = LoraRegistry(2, CountingLoader(), adapter_digest)
    digests = [registry.add(name, str(tmp_path / name)).digest for name in ("a", "copy", "b")]
    assert len(digests[0]) == 16 and digests[0] == digests[1] != digests[2]


def test_an_evicted_adapter_whose_files_changed_is_not_reloaded_under_its_old_digest(tmp_path):
    from worker.model.lora.adapter import adapter_digest

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text('{"r": 8}')
        (tmp_path / name / "adapter_model.safetensors").write_bytes(f"weights-{name}".encode())
    loader = CountingLoader()
    registry = LoraRegistry(1, loader, adapter_digest)
    a = registry.add("a", str(tmp_path / "a"))
    registry.add("b", str(tmp_path / "b"))  # evicts a
    (tmp_path / "a" / "adapter_model.safetensors").write_bytes(b"retrained")
    with pytest.raises(ValueError, match=f"changed since it was loaded \\(digest {a.digest}, now "):
        registry.get(a)
    assert len(loader.loads) == 2  # the new weights were never read as a's
    (tmp_path / "a" / "adapter_model.safetensors").write_bytes(b"weights-a")  # the same files again
    assert registry.get(a)["name"] == "a"


def _lora_request(lora_id: int, **kwargs):
    request = make_request(**kwargs)
    if lora_id:
        request.lora = LoraRef(lora_id, f"adapter-{lora_id}", f"/adapters/{lora_id}")
    return request


def test_a_request_whose_adapter_would_exceed_max_loras_waits_while_others_run():
    scheduler = make_scheduler(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=64)
    scheduler.config.max_loras = 2
    # Distinct prompts: a request sharing a prompt being prefilled would wait for it (the prefix cache).
    requests = [
        _lora_request(i, prompt=[10 * k + j + 1 for j in range(6)], max_tokens=4)
        for k, i in enumerate((1, 2, 3, 0, 1))
    ]
    for r in requests:
        scheduler.add_request(r)
    first = scheduler.schedule()
    admitted = [s.request for s in first.scheduled]
    assert [r.lora_id for r in admitted] == [1, 2, 0, 1]  # adapter 3 waits; the base and adapter 1 go on
    assert [r.lora_id for r in scheduler.waiting] == [3]
    plans = [first]
    runner = ScriptedRunner()
    requests_out, out = runner.execute(first)
    sampled = {r.request_id: t for r, t in zip(requests_out, out.token_ids, strict=True)}
    scheduler.update_from_output(first, sampled)
    plans += drive(scheduler, runner)
    for plan in plans:
        in_batch = {s.request.lora_id for s in plan.scheduled} - {0}
        assert len(in_batch) <= 2
        running = {r.lora_id for r in scheduler.running} - {0}
        assert len(running) <= 2
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)


def test_max_loras_holds_under_preemption_on_a_random_workload():
    import random

    rng = random.Random(3)
    scheduler = make_scheduler(num_blocks=24, block_size=4, max_num_seqs=6, max_num_batched_tokens=24)
    scheduler.config.max_loras = 2
    requests = [
        _lora_request(rng.randint(0, 4), num_prompt_tokens=rng.randint(1, 30), max_tokens=rng.randint(1, 12))
        for _ in range(30)
    ]
    for r in requests:
        scheduler.add_request(r)
    plans = drive(scheduler, ScriptedRunner())
    assert scheduler.num_preemptions > 0
    for plan in plans:
        assert len({s.request.lora_id for s in plan.scheduled} - {0}) <= 2
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)


def test_prefix_cache_never_shares_blocks_between_adapters_or_with_the_base_model():
    bm = BlockManager(num_blocks=32, block_size=4)
    prompt = list(range(1, 14))
    owners = {}
    for lora_id in (0, 1, 2):
        request = _lora_request(lora_id, prompt=prompt)
        assert bm.find_cached_prefix(request) == []  # nothing of another adapter is hit
        assert bm.allocate(request, len(prompt))
        request.num_computed_tokens = len(prompt)
        bm.cache_full_blocks(request)
        owners[lora_id] = request.block_ids[:3]
    for lora_id in (0, 1, 2):  # the same adapter again hits its own blocks
        assert bm.find_cached_prefix(_lora_request(lora_id, prompt=prompt)) == owners[lora_id]
    assert len({b for blocks in owners.values() for b in blocks}) == 9


def test_lora_settings_parse_the_module_list_and_refuse_a_bad_one():
    config = LoraConfig(lora_modules="sql=/a/sql, chat=/a/chat", max_loras=2)
    assert config.enabled and config.max_cpu_loras == 2
    assert config.modules() == {"sql": "/a/sql", "chat": "/a/chat"}
    assert not LoraConfig().enabled
    with pytest.raises(ValueError, match="name=path"):
        LoraConfig(lora_modules="sql")
    with pytest.raises(ValueError, match="twice"):
        LoraConfig(lora_modules="a=/x,a=/y")
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LoraConfig(enabled=True, max_loras=4, max_cpu_loras=2)


def test_worker_settings_carry_the_lora_settings_to_the_engine_and_scheduler(monkeypatch):
    from worker.server.settings import WorkerSettings

    monkeypatch.setenv("WORKER_LORA_MODULES", "sql=/a/sql")
    monkeypatch.setenv("WORKER_MAX_LORAS", "3")
    monkeypatch.setenv("WORKER_MAX_CPU_LORAS", "5")
    monkeypatch.setenv("WORKER_MAX_LORA_RANK", "64")
    config = WorkerSettings().engine_config()
    assert config.lora == LoraConfig(
        enabled=True, lora_modules="sql=/a/sql", max_loras=3, max_cpu_loras=5, max_lora_rank=64
    )
    assert config.scheduler.max_loras == 3
    monkeypatch.delenv("WORKER_LORA_MODULES")
    assert not WorkerSettings().engine_config().lora.enabled  # off by default
