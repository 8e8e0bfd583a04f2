#!/usr/bin/env bash
# On the GPU host: what the stages changed under outputs/ (each run record with its .sig; an
# instance-log folder whole) and the logs, in one tar for the way back. The host's dvc.lock and
# params.yaml stay there: the commit that lands is the checkout's own, with these artifacts added.
# `--keep` only copies what changed into $PREFIX/kept (stages.sh does after each stage): a later
# `dvc exp run` that is stopped part-way resets the workspace, and the earlier stages' artifacts
# would be gone from it. The tar holds what was kept, the newest copy of each file.
# Usage: bash collect.sh OUT_TAR | --keep   (env: PREFIX=/root, LOGS=$PREFIX/logs)
set -euo pipefail
out="${1:?usage: collect.sh OUT_TAR | --keep}" prefix="${PREFIX:-/root}" logs="${LOGS:-${PREFIX:-/root}/logs}"
kept="$prefix/kept"
cd "$prefix/checkout"
list="$(mktemp)"
git status --porcelain --untracked-files=all -- outputs | awk '$1 != "D" {print $NF}' > "$list"
# An instance-log folder comes back whole: a run rewrites all of it, and the files that came out
# the same as the checkout's are not "changed", yet the folder replaces the old one as a whole.
folders="$({ grep -o '^outputs/[^/]*/[^/]*_instances/' "$list" || true; } | sort -u)"
for folder in $folders; do
  find "$folder" -type f >> "$list"
  rm -rf "${kept:?}/$folder"  # a folder kept from an earlier run of its stage is replaced, not merged
done
sort -u -o "$list" "$list"
mkdir -p "$kept"
xargs -r -d '\n' cp --parents -p -t "$kept/" < "$list"
[ "$out" = --keep ] && exit 0
(cd "$kept" && find outputs -type f 2>/dev/null | sort) > "$list"
tar -czf "$out" -C "$kept" -T "$list" -C / "${logs#/}"
echo "$(wc -l < "$list") file(s) under outputs/ and the logs in $out"
