#!/bin/sh
# `make images`: the stack's images (llmserve, llmserve-redis, llmserve-prometheus) with nothing pulled from
# Docker Hub and no multi-GB CUDA torch downloaded.
#
# 1. The base: BASE_IMAGE when set (e.g. python:3.11-slim where Docker Hub is reachable), otherwise
#    llmserve-base:bookworm, built from Debian's packages by deploy/base/build_base_image.sh.
# 2. The torch wheel pinned in requirements.txt, when one lies in a PIP_FIND_LINKS folder (or /opt/wheels),
#    is copied into deploy/wheels/, which the image build prefers over PyPI.
# 3. `docker compose build` (or Debian's docker-compose) with that base.
set -eu
cd "$(dirname "$0")/.."

if [ -z "${BASE_IMAGE:-}" ]; then
    BASE_IMAGE=llmserve-base:bookworm
    deploy/base/build_base_image.sh "$BASE_IMAGE"
fi
export BASE_IMAGE

torch_version="$(sed -n 's/^torch==//p' requirements.txt)"
for dir in $(echo "${PIP_FIND_LINKS:-}" | tr ' ,' '  ') /opt/wheels; do
    for wheel in "$dir"/torch-"$torch_version"+cpu-*.whl "$dir"/torch-"$torch_version"-*.whl; do
        if [ -f "$wheel" ] && [ ! -f "deploy/wheels/$(basename "$wheel")" ]; then
            echo "bringing $wheel into the build"
            cp "$wheel" deploy/wheels/
        fi
    done
done

deploy/compose.sh build
