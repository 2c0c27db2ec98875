"""Which adapters are known (name -> path, id) and which are held in memory (least recently used evicted,
reloaded from their path when asked again). Pure Python: the loader is injected, so it is tested without a
model. Thread-safe: the gRPC handlers load and unload while the engine thread reads."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class LoraRef:
    """An adapter as a request names it. The id is new on every load, so KV blocks and anything else keyed
    by it never mix two adapters that once shared a name."""

    lora_id: int  # >= 1; 0 is the base model
    name: str
    path: str
    digest: str = ""  # the files' content hash as loaded: the same on every worker ("": not computed)


class LoraNotFoundError(KeyError):
    pass


class LoraUnavailableError(RuntimeError):
    """An adapter of the step could not be loaded again (its directory changed or went away after it was
    evicted or unloaded): the engine aborts that adapter's requests and goes on."""

    def __init__(self, ref: LoraRef, reason: str) -> None:
        super().__init__(f"LoRA adapter {ref.name!r} could not be loaded from {ref.path}: {reason}")
        self.ref = ref


def _no_digest(path: str) -> str:
    return ""


class LoraRegistry(Generic[T]):
    def __init__(
        self, max_cpu_loras: int, load: Callable[[str, str], T], digest: Callable[[str], str] = _no_digest
    ) -> None:
        if max_cpu_loras < 1:
            raise ValueError("max_cpu_loras must be positive")
        self.max_cpu_loras = max_cpu_loras
        self._load = load  # (name, path) -> weights; raises on an adapter that cannot be served
        self._digest = digest  # path -> the content identity of the adapter's files
        self._refs: dict[str, LoraRef] = {}
        self._resident: OrderedDict[int, T] = OrderedDict()  # lora id -> weights, least recent first
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.num_loads = 0  # loads from disk, reloads after eviction included

    def add(self, name: str, path: str) -> LoraRef:
        """Load (and so check) an adapter and register it under `name`; ValueError if the name is taken."""
        with self._lock:
            if name in self._refs:
                raise ValueError(f"a LoRA adapter named {name!r} is already loaded")
        weights = self._load(name, path)  # outside the lock: reading a file must not stall the engine
        digest = self._digest(path)
        with self._lock:
            if name in self._refs:
                raise ValueError(f"a LoRA adapter named {name!r} is already loaded")
            ref = LoraRef(next(self._ids), name, path, digest)
            self._refs[name] = ref
            self.num_loads += 1
            self._keep(ref.lora_id, weights)
        return ref

    def remove(self, name: str) -> LoraRef:
        """Forget an adapter. Requests already holding its ref still run: they reload it from its path."""
        with self._lock:
            ref = self._refs.pop(name, None)
            if ref is None:
                raise LoraNotFoundError(name)
            self._resident.pop(ref.lora_id, None)
            return ref

    def resolve(self, name: str) -> LoraRef | None:
        with self._lock:
            return self._refs.get(name)

    def refs(self) -> list[LoraRef]:
        with self._lock:
            return list(self._refs.values())

    def resident_ids(self) -> list[int]:
        """Ids held in memory, least recently used first."""
        with self._lock:
            return list(self._resident)

    def get(self, ref: LoraRef) -> T:
        """The adapter's weights, reloaded from its path when they were evicted; marks it recently used.
        ValueError if the files there are no longer the ones loaded: their digest names the adapter's
        output (the semantic cache keys answers by it), so other weights must not run under it."""
        with self._lock:
            weights = self._resident.get(ref.lora_id)
            if weights is not None:
                self._resident.move_to_end(ref.lora_id)
                return weights
        if ref.digest and (now := self._digest(ref.path)) != ref.digest:
            raise ValueError(
                f"its files changed since it was loaded (digest {ref.digest}, now {now}): "
                "unload it and load it again to serve the new weights"
            )
        weights = self._load(ref.name, ref.path)
        with self._lock:
            self.num_loads += 1
            self._keep(ref.lora_id, weights)
        return weights

    def _keep(self, lora_id: int, weights: T) -> None:
        self._resident[lora_id] = weights
        self._resident.move_to_end(lora_id)
        while len(self._resident) > self.max_cpu_loras:
            self._resident.popitem(last=False)
