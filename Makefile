# Two commands on a fresh machine: `make run` (the PTB demo) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SHARED_DATA := $(abspath ../shared/data)
ifneq ($(wildcard $(SHARED_DATA)/ptb),)
export SEQLM_DATA ?= $(SHARED_DATA)
endif

.PHONY: run test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first (its wheel is on this machine), so nothing pulls a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,kenlm,ctc,onnx,tokenizers]'  # the peers the tests check against (kenlm, pyctcdecode: numpy<2; onnxruntime; sentencepiece, tokenizers)
	touch $@

run: $(VENV)/.installed
	$(PY) -m seqlm.demo

test: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest tests

bench: $(VENV)/.installed
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) runs
