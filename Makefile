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
$(GEN): protos/worker.proto protos/cache.proto $(VENV)/.installed
	$(PY) -m grpc_tools.protoc -Iservices/gen=protos --python_out=. --grpc_python_out=. --pyi_out=. protos/worker.proto protos/cache.proto

protos: $(GEN)

$(MODEL_DIR)/config.json: | $(VENV)/.installed
	$(PY) -m worker.fetch_model --output $(MODEL_DIR)

model: $(MODEL_DIR)/config.json

run: venv protos model
	$(PY) -m scripts.run_stack

test: venv protos model
	$(PY) -m pytest -q tests

bench: venv protos model
	$(PY) -m bench.engine_bench

lint: venv
	$(PY) -m ruff check .

clean:
	rm -rf services/gen/*_pb2*.py .pytest_cache
