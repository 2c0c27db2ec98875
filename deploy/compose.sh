#!/bin/sh
# Compose, whichever is installed: the `docker compose` plugin, or Debian's `docker-compose` (1.29).
# The classic builder that docker-compose 1.x drives reads the root .dockerignore, as BuildKit does.
set -eu
cd "$(dirname "$0")/.."
# The project name docker-compose.yml used to set (`name:`), which docker-compose 1.x does not read.
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-llmserve}"
if docker compose version >/dev/null 2>&1; then
    exec docker compose "$@"
fi
exec docker-compose "$@"
