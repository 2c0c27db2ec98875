"""`python -m cache_service`: the semantic cache gRPC service (settings from CACHE_* and REDIS_URL)."""

from __future__ import annotations

import asyncio
import logging

from cache_service.server import serve
from cache_service.settings import CacheSettings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(CacheSettings()))


if __name__ == "__main__":
    main()
