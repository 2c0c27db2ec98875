#!/bin/sh
# The shared recipe of the side images (deploy/redis/Dockerfile, deploy/prometheus/Dockerfile): Debian's
# packages on the stack's base image, and a system user with a fixed numeric id (the packages' postinst keeps
# it, so that runAsNonRoot can check it) that owns the service's data folder.
#
#   debian_service.sh USER UID DATA_DIR PACKAGE...
set -eu
user=$1
uid=$2
data_dir=$3
shift 3
groupadd --system --gid "$uid" "$user"
useradd --system --uid "$uid" --gid "$user" --home-dir "/var/lib/$user" --no-create-home \
    --shell /usr/sbin/nologin "$user"
apt-get update
apt-get install -y --no-install-recommends "$@"
rm -rf /var/lib/apt/lists/*
mkdir -p "$data_dir"
chown "$user:$user" "$data_dir"
