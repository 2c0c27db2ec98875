"""LoRA adapters behind the gateway: which names are adapters (a request's `model`), /v1/models' cards,
and vLLM's run-time routes (POST /v1/load_lora_adapter, /v1/unload_lora_adapter), forwarded to every
worker replica. Adapters loaded here are remembered and loaded again on a replica that answers a request
for one with "not found" (a worker that joined or restarted since). Each adapter's content digest (the
worker's hash of its files) is its identity in the semantic cache's key."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from common.gen import worker_pb2
from gateway import observability
from gateway.errors import APIError, client_details, from_grpc, unavailable

log = logging.getLogger(__name__)

KNOWN_TTL_S = 5.0  # adapter names are asked of a worker again after this long (others may load some)


@dataclass(frozen=True)
class AdapterCard:
    path: str  # the PEFT directory on the workers' disk
    parent: str  # the base model it runs on
    digest: str = ""  # the workers' hash of its files ("": unknown, or the workers disagree)


class LoraAdapters:
    def __init__(self, pool) -> None:  # a gateway.worker_pool.WorkerPool
        self.pool = pool
        self.loaded_here: dict[str, AdapterCard] = {}  # loaded through this gateway
        self._known: dict[str, AdapterCard] = {}  # as the workers last listed them
        self._known_at = float("-inf")

    def parent_of(self, name: str) -> str | None:
        """The base model of adapter `name` as last seen (None: not known as an adapter)."""
        card = self.loaded_here.get(name) or self._known.get(name)
        return card.parent if card else None

    async def listing(self, timeout_s: float = 2.0) -> dict[str, AdapterCard]:
        """The adapters the fleet serves, name -> card: one answering worker of each model is asked."""
        await self.pool.start()
        by_model: dict[str, list] = {}
        for replica in self.pool.replicas:
            by_model.setdefault(replica.model or "", []).append(replica)
        found: dict[str, AdapterCard] = {}
        last_error: grpc.aio.AioRpcError | None = None
        answered = False
        for replicas in by_model.values():
            for replica in replicas:
                try:
                    reply = await replica.stub.ListLoraAdapters(
                        worker_pb2.ListLoraAdaptersRequest(), timeout=timeout_s
                    )
                    parent = replica.model or (await self.pool.model_info(timeout_s)).model_name
                except grpc.aio.AioRpcError as exc:
                    observability.WORKER_ERRORS.labels(exc.code().name).inc()
                    last_error = exc
                    continue
                answered = True
                found.update({a.name: AdapterCard(a.path, parent, a.digest) for a in reply.adapters})
                break
        if not answered:
            detail = client_details(last_error) if last_error else "no replica"
            raise unavailable(f"No worker is available: {detail}")
        self._known, self._known_at = found, time.monotonic()
        return dict(found)

    async def _listed(self, name: str) -> AdapterCard | None:
        """`name`'s card as the workers list it: the last listing while it is fresh and has it, else a new one
        (raises APIError when no worker answers)."""
        if name in self._known and time.monotonic() - self._known_at < KNOWN_TTL_S:
            return self._known[name]
        return (await self.listing()).get(name)

    async def base_of(self, name: str) -> str | None:
        """The base model of adapter `name`, asking the workers when the answer is not fresh; None if no
        worker serves such an adapter."""
        if name in self.loaded_here:  # a worker that lost it gets it again (`reload_on`)
            return self.loaded_here[name].parent
        try:
            card = await self._listed(name)
        except APIError:
            return None
        return card.parent if card else None

    async def cache_identity(self, name: str) -> str | None:
        """The semantic cache's model for `name` (a model check_model accepted): the name of a base model,
        `name@digest` for an adapter, so a name loaded again from other files never meets the old answers.
        None (bypass the cache) when the adapter's digest is not known. Loads and unloads through this
        gateway count at once; one through another gateway once the listing is older than KNOWN_TTL_S."""
        if name in self.pool.served_models():
            return name
        try:
            card = await self._listed(name)
        except APIError:
            card = self.loaded_here.get(name)  # as this gateway's load reply said
        return f"{name}@{card.digest}" if card is not None and card.digest else None

    async def load(self, name: str, path: str) -> None:
        """Load on every worker whose base model takes it. A worker of another base model refuses it;
        the load fails only when no worker took it (the first refusal is then the answer)."""
        await self.pool.start()
        request = worker_pb2.LoadLoraAdapterRequest(lora_name=name, lora_path=path)
        parents: set[str] = set()
        digests: set[str] = set()
        refusal: grpc.aio.AioRpcError | None = None
        for replica in self.pool.replicas:
            try:
                reply = await replica.stub.LoadLoraAdapter(request, timeout=120.0)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:  # gets it when it answers "not found" later
                    log.warning("worker %s unreachable for LoRA load of %s", replica.addr, name)
                    continue
                refusal = refusal or exc
                continue
            parents.add(replica.model or (await self.pool.model_info()).model_name)
            digests.update(a.digest for a in reply.adapters if a.name == name)
        if not parents:
            if refusal is not None:
                raise from_grpc(refusal, "lora_path")
            raise unavailable("No worker is available to load the adapter")
        digest = digests.pop() if len(digests) == 1 else ""  # workers that read other files: no identity
        self.loaded_here[name] = AdapterCard(path, sorted(parents)[0], digest)
        self._known[name] = self.loaded_here[name]
        self._known_at = float("-inf")

    async def unload(self, name: str) -> None:
        await self.pool.start()
        request = worker_pb2.UnloadLoraAdapterRequest(lora_name=name)
        self.loaded_here.pop(name, None)
        self._known.pop(name, None)  # its digest is forgotten now, not when the listing expires
        found = 0
        errors: list[grpc.aio.AioRpcError] = []
        for replica in self.pool.replicas:
            try:
                await replica.stub.UnloadLoraAdapter(request, timeout=10.0)
                found += 1
            except grpc.aio.AioRpcError as exc:
                errors.append(exc)
        self._known_at = float("-inf")
        if not found:
            if errors:
                raise from_grpc(errors[0], "lora_name")
            raise unavailable("No worker is available")

    async def reload_on(self, replica, name: str) -> bool:
        """A replica answered "not found" for `name`: load it there if this gateway loaded it; True if so."""
        card = self.loaded_here.get(name)
        if card is None:
            return False
        try:
            await replica.stub.LoadLoraAdapter(
                worker_pb2.LoadLoraAdapterRequest(lora_name=name, lora_path=card.path), timeout=120.0
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("worker %s: loading LoRA %s again failed: %s", replica.addr, name, exc.details())
            return False
        log.info("worker %s had lost LoRA adapter %s: loaded it again", replica.addr, name)
        return True


def check_admin(request, settings) -> None:
    """Run-time LoRA routes: off unless GATEWAY_ALLOW_RUNTIME_LORA_UPDATING; the admin key when one is set,
    else the API key."""
    from gateway.http_io import check_api_key

    if not settings.gateway_allow_runtime_lora_updating:
        raise APIError(
            404,
            "Run-time LoRA loading is off on this gateway (GATEWAY_ALLOW_RUNTIME_LORA_UPDATING)",
            "invalid_request_error",
            None,
            "not_found",
        )
    check_api_key(request, settings.gateway_admin_key or settings.api_key)


def refuse_served_name(name: str, served: set[str]) -> None:
    """An adapter may not take the name of a model the fleet serves (a base model or the embedding model):
    /v1/models would list it twice and routes would disagree about what it is."""
    from gateway.errors import invalid_request

    if name in served:
        raise invalid_request(
            f"{name!r} is the name of a served model; choose another adapter name", param="lora_name"
        )


def lora_field(body: dict, name: str) -> str:
    from gateway.errors import invalid_request

    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise invalid_request(f"{name} is required (a non-empty string)", param=name)
    return value.strip()


async def read_json_object(request, limit: int) -> dict:
    import json

    from gateway.errors import invalid_request
    from gateway.http_io import read_body

    body = await read_body(request, limit)
    try:
        value = json.loads(body or b"{}")
    except json.JSONDecodeError as exc:
        raise invalid_request(f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise invalid_request("the body must be a JSON object")
    return value
