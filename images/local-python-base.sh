#!/usr/bin/env bash
# Builds a stand-in for python:3.11-slim from the Debian archive, for machines whose Docker
# engine cannot pull from Docker Hub (air-gapped or mirror-only networks). Same layout the
# Dockerfiles rely on: Debian 12, CPython 3.11 on PATH as `python`, `python -m venv` working.
# The host's CA bundle goes in too, so pip inside the build trusts the same TLS proxy the host
# does. Usage: images/local-python-base.sh [TAG]   (needs root, debootstrap and docker)
set -euo pipefail
tag=${1:-kvrank-local/python:3.11-slim}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$tag" >/dev/null 2>&1; then echo "$tag"; exit 0; fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=ca-certificates,python3,python3-venv \
  bookworm "$root" "$mirror" >&2
ln -s /usr/bin/python3 "$root/usr/local/bin/python"
ln -s /usr/bin/python3 "$root/usr/local/bin/python3"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
  -c 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV LANG=C.UTF-8' \
  -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  -c 'CMD ["python3"]' - "$tag" >&2
echo "$tag"
