# Two entry points for a fresh machine (see README): `make pipeline` and `make test`; on a GPU
# host, `make test-gpu` runs the GPU suite whole.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; a GPU host overrides this (e.g. TORCH_SPEC=torch==2.11.0).
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= embedded,pipeline,dev,eval

.PHONY: install pipeline test test-gpu

# Last steps: the unmodified WhisperLiveKit client, for the protocol tests and the smoke (its own
# heavy ASR dependencies are not needed for the client module); SimulEval 1.1.4, whose own
# `--score-only` re-scores the eval's instance logs in a test: it pins tqdm==4.64.1 (alignatt needs
# >=4.66), so it goes in without its pins, with what its scoring imports beside it.
$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '$(TORCH_SPEC)'
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	$(PY) -m pip install -q --no-deps whisperlivekit==0.2.26
	$(PY) -m pip install -q pandas textgrid tornado soundfile
	$(PY) -m pip install -q --no-deps simuleval==1.1.4
	touch $@

install: $(VENV)/.installed

# The whole pipeline on the embedded default (Gemma-3-270M on CPU; vLLM seams recorded as skipped).
pipeline: install
	$(VENV)/bin/dvc repro

# The full test suite (GPU tests skip without CUDA). `.ci/run` calls this.
test: install
	$(PY) -m pytest -q

# The GPU suite whole on a GPU host, in one command: every GPU test in a child process of its own,
# none may leave GPU memory held; recorded as outputs/$(PROFILE)/gpu_tests.json (exit 1 on a
# failure). The Python is the one with vLLM: this checkout's .venv if there is one, else python3.
PROFILE ?= h200
PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
test-gpu:
	$(PYTHON) -m alignatt test-gpu --profile $(PROFILE) --out outputs/$(PROFILE)/gpu_tests.json \
		--verdict outputs/$(PROFILE)/gpu_tests_verdict.json
