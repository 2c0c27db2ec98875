# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL_DIR ?= models/SmolLM2-135M-Instruct
GEN := services/gen/worker_pb2.py services/gen/cache_pb2.py

.PHONY: run test venv protos model bench lint clean

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

venv: $(VENV)/.installed

# Generated stubs: never edited by hand.
$(GEN) &: protos/worker.proto protos/cache.proto $(VENV)/.installed
	$(PY) -m grpc_tools.protoc -Iservices/gen=protos --python_out=. --grpc_python_out=. --pyi_out=. protos/worker.proto protos/cache.proto

protos: $(GEN)

$(MODEL_DIR)/config.json: | $(VENV)/.installed
	$(PY) -m worker.fetch_model --output $(MODEL_DIR)

model: $(MODEL_DIR)/config.json

run: venv protos model
	$(PY) -m scripts.run_stack

# promtool and prometheus (for the monitoring checks) are not on PyPI: unpack Debian's package
# into the venv, without installing it system-wide or starting a service.
$(VENV)/bin/prometheus: | $(VENV)/.installed
	tmp=$$(mktemp -d) && cd $$tmp && \
	  { apt-get download prometheus 2>/dev/null || { apt-get update -qq && apt-get download prometheus; }; } && \
	  dpkg-deb -x prometheus_*.deb x && \
	  cp x/usr/bin/promtool $(CURDIR)/$(VENV)/bin/promtool && \
	  cp x/usr/bin/prometheus $(CURDIR)/$(VENV)/bin/prometheus && \
	  rm -rf $$tmp

test: venv protos model $(VENV)/bin/prometheus
	$(PY) -m pytest -q tests

# Every benchmark writes its own section of docs/BENCHMARKS.md (each takes minutes on two cores).
bench: venv protos model
	$(PY) -m bench.engine_bench --write-docs
	$(PY) -m bench.serving_bench
	$(PY) -m bench.cache_quality --write-docs
	$(PY) -m bench.cache_latency --write-docs

lint: venv
	$(PY) -m ruff check .

clean:
	rm -rf services/gen/*_pb2*.py .pytest_cache
