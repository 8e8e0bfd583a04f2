#!/usr/bin/env bash
# Make this machine run rootful podman with no registry (shared facts: containers/README.md):
# podman, runc and mmdebstrap from Debian's packages, and the engine settings that work where
# there is no systemd, no journald and no CAP_SYS_RESOURCE. Idempotent; needs root.
set -euo pipefail
if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v runc >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null
fi
nofile=$(ulimit -Hn)
mkdir -p /etc/containers
cat > /etc/containers/containers.conf <<CONF
[containers]
netns = "host"
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
podman info --format '{{.Host.OCIRuntime.Name}} {{.Store.GraphDriverName}}' >/dev/null
