"""The worker's LoRA RPCs and the `model` field of Generate, proto <-> LoraManager (thin, like the servicer).

Loading reads the adapter from the worker's disk on a thread (the engine thread keeps stepping); the
registry is thread-safe."""

from __future__ import annotations

import asyncio

from common.gen import worker_pb2
from worker.engine.errors import AlreadyExistsError, EngineError, InvalidRequestError, NotEnabledError
from worker.engine.lora_registry import LoraNotFoundError, LoraRef
from worker.model.lora.adapter import LoraAdapterError


class LoraNotFound(EngineError):
    reason = "MODEL_NOT_FOUND"


def resolve_model(manager, served: str, model: str) -> LoraRef | None:
    """The adapter a Generate's `model` names; None for the base model; LoraNotFound for anything else."""
    if not model or model == served:
        return None
    ref = manager.registry.resolve(model) if manager is not None else None
    if ref is None:
        names = [served, *(r.name for r in manager.registry.refs())] if manager is not None else [served]
        raise LoraNotFound(
            f"model {model!r} is not served here (served: {', '.join(map(repr, names))})", "model"
        )
    return ref


def adapter_list(manager) -> worker_pb2.LoraAdapterList:
    if manager is None:
        return worker_pb2.LoraAdapterList(enabled=False)
    return worker_pb2.LoraAdapterList(
        enabled=True,
        adapters=[
            worker_pb2.LoraAdapter(name=r.name, path=r.path, lora_id=r.lora_id, digest=r.digest)
            for r in manager.registry.refs()
        ],
        max_loras=manager.config.max_loras,
        max_lora_rank=manager.config.max_lora_rank,
    )


def _require(manager) -> None:
    if manager is None:
        raise NotEnabledError("LoRA adapters are not enabled on this worker (WORKER_ENABLE_LORA)")


async def load(
    manager, served: str, request: worker_pb2.LoadLoraAdapterRequest
) -> worker_pb2.LoraAdapterList:
    _require(manager)
    name, path = request.lora_name.strip(), request.lora_path.strip()
    if not name or not path:
        raise InvalidRequestError(
            "lora_name and lora_path are both required", "lora_name" if not name else "lora_path"
        )
    if name == served:
        raise InvalidRequestError(
            f"{name!r} is the base model's name; choose another adapter name", "lora_name"
        )
    try:
        await asyncio.to_thread(manager.registry.add, name, path)
    except LoraAdapterError as exc:
        raise InvalidRequestError(str(exc), "lora_path") from None
    except ValueError as exc:  # the name is taken
        raise AlreadyExistsError(str(exc), "lora_name") from None
    return adapter_list(manager)


def unload(manager, request: worker_pb2.UnloadLoraAdapterRequest) -> worker_pb2.LoraAdapterList:
    _require(manager)
    try:
        manager.registry.remove(request.lora_name)
    except LoraNotFoundError:
        raise LoraNotFound(f"no LoRA adapter named {request.lora_name!r} is loaded", "lora_name") from None
    return adapter_list(manager)
