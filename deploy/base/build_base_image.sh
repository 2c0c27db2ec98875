#!/bin/sh
# Builds the stack's base image from Debian's own packages, for machines that cannot pull from Docker Hub:
# debootstrap a minimal bookworm with python3 and venv, trust the certificate authorities this machine
# trusts (a TLS-inspecting egress proxy signs with one of them), and `docker import` the result.
#
#   deploy/base/build_base_image.sh [IMAGE]          default IMAGE: llmserve-base:bookworm
#
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), DEBIAN_SUITE (default bookworm),
# EXTRA_CA_DIR (default /usr/local/share/ca-certificates: *.crt there are added to the image's trust store).
# Needs root, debootstrap and a running Docker daemon. Skips the work when the image already exists.
set -eu

IMAGE="${1:-llmserve-base:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="${DEBIAN_SUITE:-bookworm}"
EXTRA_CA_DIR="${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE exists"
    exit 0
fi

rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT

debootstrap --variant=minbase --include=ca-certificates,python3,python3-venv,make \
    "$SUITE" "$rootfs" "$MIRROR"

# Keep apt working inside images built from this one, and keep them small.
printf 'deb %s %s main\ndeb %s %s-updates main\n' "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" \
    > "$rootfs/etc/apt/sources.list"
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    > "$rootfs/etc/apt/apt.conf.d/90llmserve-no-recommends"

if ls "$EXTRA_CA_DIR"/*.crt >/dev/null 2>&1; then
    cp "$EXTRA_CA_DIR"/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates
fi

chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin

tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$IMAGE"
echo "built base image $IMAGE"
