"""`python -m gateway`: serve the OpenAI-compatible API with uvicorn on GATEWAY_HOST:GATEWAY_PORT."""

from __future__ import annotations

import logging
import sys

import uvicorn

from common.logs import configure_logging
from gateway.app import create_app
from gateway.drain import DrainingServer
from gateway.settings import GatewaySettings


def main() -> None:
    configure_logging()  # LOG_FORMAT=json: JSON lines with the request id
    settings = GatewaySettings.from_cli(sys.argv[1:])
    app = create_app(settings)
    logging.getLogger(__name__).info(
        "gateway on http://%s:%d -> workers %s",
        settings.gateway_host,
        settings.gateway_port,
        settings.worker_addr,
    )
    config = uvicorn.Config(
        app,
        host=settings.gateway_host,
        port=settings.gateway_port,
        access_log=False,
        log_level="info",
        # uvicorn's loggers pass to the root handler configure_logging set (JSON lines with LOG_FORMAT=json)
        # instead of its own plain-text handlers.
        log_config=None,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=5,  # after the drain (gateway/drain.py), for connections still open
    )
    DrainingServer(config, app.state.drain, settings.gateway_drain_timeout_s).run()


if __name__ == "__main__":
    main()
