"""`python -m cache_service`: the semantic cache gRPC service (settings from CACHE_* and REDIS_URL)."""

from __future__ import annotations

import asyncio
import logging
import sys

from redis.exceptions import RedisError

from cache_service.artifacts import ArtifactError
from cache_service.artifacts import verify as verify_artifacts
from common.grpc_server import skip_final_collection
from common.logs import configure_logging


def main() -> None:
    configure_logging()  # LOG_FORMAT=json: JSON lines, as the gateway and the worker
    try:
        verify_artifacts()  # the settings read the calibration: check it before they do
    except ArtifactError as exc:
        logging.getLogger("cache_service").error("cannot start: %s", exc)
        sys.exit(1)
    # Imported after the check: the calibration and the word list are located and read on import.
    from cache_service.server import serve
    from cache_service.settings import CacheSettings

    settings = CacheSettings()
    try:
        asyncio.run(serve(settings))
        skip_final_collection()
    except RedisError as exc:
        logging.getLogger("cache_service").error("cannot start: Redis at %s: %s", settings.redis_url, exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
