#!/usr/bin/env bash
# The local base image for machines without a registry: Debian bookworm (Python 3.11, as the CPU
# lock) from Debian's own packages, imported into podman as localhost/alignatt-base:bookworm.
# Skipped when that image is already there. Needs root, podman and mmdebstrap (podman-host.sh).
set -euo pipefail
tag=${1:-localhost/alignatt-base:bookworm}
if podman image exists "$tag"; then echo "$tag: already built"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase --include=ca-certificates bookworm "$work/rootfs.tar" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
podman import --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$tag" >/dev/null
echo "$tag: $(podman image inspect --format '{{.Id}}' "$tag")"
