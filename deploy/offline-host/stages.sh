#!/usr/bin/env bash
# On the GPU host, after unpack.sh: `dvc exp run -S profile=h200 -s STAGE` for each STAGE in order,
# detached from the calling shell (a device call may return long before the stages end), each
# stage's output in $LOGS/STAGE.log (a later run of the same stage in STAGE.2.log, ...: none
# overwrites another's) and one line per start and exit status in $LOGS/stages.log.
# A failed stage does not stop the next. `-s`: each stage alone, without re-running the stages it
# depends on (run gpu-tests first by naming it). What each stage changed is kept as it exits
# (`collect.sh --keep`), so a later stage stopped part-way cannot lose it. Then `collect.sh`.
# A STAGE argument may carry more `dvc exp run` options after the stage's name, in shell quoting
# (e.g. 'load -S profiles.h200.load.speakers="128"'): an experiment off params.yaml, which the
# artifact records (provenance.params_changed) and the page names. Each entry starts from the
# checkout's params.yaml (`dvc exp run -S` leaves its changes there): an entry's -S never carries
# into the next. Quote a value with braces inside
# the argument: the words are expanded as bash would, braces included. A value with a comma is a
# Hydra sweep unless quoted for Hydra too: "load -S \"profiles.h200.load.speakers='1,128'\"".
# Usage: bash stages.sh STAGE...   (env: PREFIX=/root, LOGS=$PREFIX/logs)
set -euo pipefail
prefix="${PREFIX:-/root}" logs="${LOGS:-${PREFIX:-/root}/logs}"
[ $# -gt 0 ] || { echo "usage: stages.sh STAGE..." >&2; exit 2; }
mkdir -p "$logs"
run() {
  # shellcheck disable=SC1091
  source "$prefix/env.sh"; cd "$prefix/checkout"
  for entry in "$@"; do
    eval "words=($entry)"; stage="${words[0]}"
    log="$logs/$stage.log" n=1
    while [ -e "$log" ]; do n=$((n + 1)); log="$logs/$stage.$n.log"; done
    git checkout -q -- params.yaml
    echo "start $entry -> $(basename "$log") $(date -u +%T)" >> "$logs/stages.log"
    rc=0; dvc exp run -S profile=h200 -s "$stage" "${words[@]:1}" > "$log" 2>&1 || rc=$?
    echo "exit $stage $rc $(date -u +%T)" >> "$logs/stages.log"
    bash "$ctl/collect.sh" --keep || echo "keep $stage failed" >> "$logs/stages.log"
  done
  echo "done $(date -u +%T)" >> "$logs/stages.log"
}
ctl="$(cd "$(dirname "$0")" && pwd)"
export -f run; export prefix logs ctl
setsid nohup bash -c 'run "$@"' stages "$@" > "$logs/stages.out" 2>&1 < /dev/null &
echo "started: $* (logs in $logs)"
