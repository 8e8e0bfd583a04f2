#!/usr/bin/env bash
# On the offline GPU host, once every chunk and SUMS are in one folder: check, unpack, install the
# bundle ($PREFIX/site) and the wheels ($PREFIX/xsite) with no index, check out the carried commit
# in $PREFIX/checkout as a git repository (DVC needs one; ALIGNATT_GIT_COMMIT names the real
# commit), put the speech clips in the alignatt cache, convert the embedded model once, and write
# $PREFIX/env.sh for later shells.
# Usage: bash unpack.sh CHUNK_DIR [PREFIX]   (chunk00 holds ctl/unpack.sh: `cat chunk* | tar -x` first)
set -euo pipefail
chunks="${1:?usage: unpack.sh CHUNK_DIR [PREFIX]}" prefix="${2:-/root}"
(cd "$chunks" && sha256sum -c --quiet SUMS)
carry="$prefix/carry"; mkdir -p "$carry"
cat "$chunks"/chunk* | tar -x -C "$carry"
(cd "$carry/bundle" && sha256sum -c --quiet SHA256)
mkdir -p "$prefix/site" && cat "$carry"/bundle/part* | xz -d -T0 | tar -x -C "$prefix/site"
# uv unpacks the ~160 wheels in seconds where pip takes most of a minute of device time; pip if not
uv_whl=("$carry"/wheels/uv-*.whl)
if [ -f "${uv_whl[0]}" ] && python3 -m pip install -q --no-index --no-deps --target "$prefix/uv" "${uv_whl[0]}" \
   && "$prefix/uv/bin/uv" pip install -q --offline --no-deps --python python3 --target "$prefix/xsite" "$carry"/wheels/*.whl; then :
else python3 -m pip install -q --no-index --no-deps --target "$prefix/xsite" "$carry"/wheels/*.whl; fi
mkdir -p "$prefix/bin"
if ! command -v ssh-keygen >/dev/null && [ -f "$carry/ctl/ssh-keygen" ]; then
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$carry/ctl/lib" "$carry/ctl/ssh-keygen" > "$prefix/bin/ssh-keygen"
  chmod 755 "$prefix/bin/ssh-keygen" "$carry/ctl/ssh-keygen"
fi
cat > "$prefix/env.sh" <<ENV
export PYTHONPATH=$prefix/site:$prefix/xsite PATH=$prefix/xsite/bin:$prefix/bin:\$PATH
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export ALIGNATT_GIT_COMMIT=$(cat "$carry/ctl/COMMIT") ALIGNATT_GIT_DIRTY=0
ENV
[ -f "$carry/ctl/signing_key" ] && install -m 600 "$carry/ctl/signing_key" "$prefix/signing_key" \
  && echo "export ALIGNATT_SIGNING_KEY=$prefix/signing_key" >> "$prefix/env.sh"
# shellcheck disable=SC1091
source "$prefix/env.sh"
mkdir -p "$prefix/checkout" && cd "$prefix/checkout" && tar -xJf "$carry/src.tar.xz"
python3 -m pip install -q --no-deps --no-build-isolation -e .
git init -q && git add -A && git -c user.email=host@offline -c user.name=host commit -qm "$ALIGNATT_GIT_COMMIT"
cache="$(python3 -c 'from alignatt.models.embedded import cache_dir; print(cache_dir())')"
[ -d "$carry/clips" ] && mkdir -p "$cache" && cp -r "$carry/clips" "$cache/"  # re-checked by SHA-256 on use
python3 -c "from alignatt.models.embedded import ensure_embedded_model as e; print('embedded model:', e())"
alignatt doctor --profile h200
# What the host's packages require and nothing installed brings: not fatal, since most are optional
# at run time, but listed, so the host shows what pack.sh's not-carried.txt claims it has.
python3 -m pip check > "$prefix/pip-check.txt" 2>&1 \
  || echo "pip check: $(grep -c . "$prefix/pip-check.txt") requirement(s) not met (listed in $prefix/pip-check.txt)"
