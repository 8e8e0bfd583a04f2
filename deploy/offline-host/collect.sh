#!/usr/bin/env bash
# On the GPU host: what the stages changed under outputs/ (each run record with its .sig; an
# instance-log folder whole) and the logs, in one tar for the way back. The host's dvc.lock and params.yaml stay there: the commit
# that lands is the checkout's own, with these artifacts added.
# Usage: bash collect.sh OUT_TAR   (env: PREFIX=/root, LOGS=$PREFIX/logs)
set -euo pipefail
out="${1:?usage: collect.sh OUT_TAR}" prefix="${PREFIX:-/root}" logs="${LOGS:-${PREFIX:-/root}/logs}"
cd "$prefix/checkout"
list="$(mktemp)"
git status --porcelain --untracked-files=all -- outputs | awk '$1 != "D" {print $NF}' > "$list"
# An instance-log folder comes back whole: a run rewrites all of it, and the files that came out
# the same as the checkout's are not "changed", yet the folder replaces the old one as a whole.
{ grep -o '^outputs/[^/]*/[^/]*_instances/' "$list" || true; } | sort -u | while read -r folder; do
  find "$folder" -type f
done >> "$list"
sort -u -o "$list" "$list"
tar -czf "$out" -T "$list" -C / "${logs#/}"
echo "$(wc -l < "$list") file(s) under outputs/ and the logs in $out"
