# kvrank — the single entry point. `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
KVRANK_CACHE ?= $(HOME)/.cache/kvrank
export KVRANK_CACHE
# The venv is rebuilt only when a pyproject.toml changes (kvrank's or the example plugin's:
# the tests serve the example model through its entry point, as a team's image would).
PLUGIN := examples/sasrec
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(PLUGIN)/pyproject.toml | sha1sum | cut -c1-12)
PHASE := scripts/phase.sh

CLUSTER_DIR ?= $(KVRANK_CACHE)/cluster

IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# Where `make images` names its images and `make push-images` pushes them.
REGISTRY ?= ghcr.io/kvrank
IMAGE_NAMES := ranker operator redis router ranker-sasrec ranker-quickstart
# The demo model images the examples serve (model.uri: oci://…), tagged by model version.
MODEL_IMAGES := feed-ranker-model:v1 feed-ranker-model:v2 sasrec-model:s1
# What `make push-images` writes (each image's digest) and `make release` pins the chart to.
RELEASE_IMAGES ?= build/release-images.txt
# The Dockerfiles' base; images/local-python-base.sh builds a stand-in where Docker Hub is unreachable.
PYTHON_IMAGE ?= python:3.11-slim
DOCKER_BUILD_FLAGS ?=
HELM ?= $$(bash e2e/localkube/build.sh)/helm

.PHONY: help venv services kube-bins prepare-kube-bins prepare-images test-images lint kube-score chart-readme test test-only test-stress check push-images test-lane-cluster test-lane-rest lint-then-rest demo bench bench-routing bench-overload-front bench-redis-fault bench-wire bench-batching bench-triton bench-cuda bench-production train train-movielens \
        cluster-up cluster-down images helm-lint core-types crd clean e2e e2e-kind release

help: ## List the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(PLUGIN)/pyproject.toml
	@rm -f $(VENV)/.installed-*
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[ranker,operator,dev]' -e $(PLUGIN)
	@touch $@

venv: $(STAMP) ## Create .venv and install kvrank with all extras (reused while pyproject.toml is unchanged)

services: ## Install the service binaries the tests start (redis-server) when missing
	@bash scripts/ensure-services.sh

kube-bins: ## Build (or reuse) the control plane, kubelet, containerd, runc, CoreDNS … from Go modules
	@# side by side: one downloads while the other compiles
	@bash e2e/localkube/build.sh >/dev/null & cp=$$!; bash e2e/localkube/build-node.sh >/dev/null; wait $$cp

lint: venv ## ruff, mypy --strict, import-linter contracts, functions <= 60 lines, actionlint on the workflows, kube-score on the manifests
	$(VENV)/bin/ruff check ranker operator e2e images examples benchmarks
	$(VENV)/bin/ruff format --check ranker operator e2e images examples benchmarks
	$(VENV)/bin/mypy
	PYTHONPATH=e2e $(VENV)/bin/lint-imports  # the e2e harness (localkube) is under contract too
	$(PY) scripts/function_length.py
	"$$(bash e2e/localkube/build-node.sh)/actionlint" -shellcheck= -pyflakes= .github/workflows/*.yml
	@$(MAKE) --no-print-directory kube-score

test: ## Fresh-clone safe: install everything, lint, run ALL tests, stop what was started
	@$(PHASE) services $(MAKE) --no-print-directory services
	@$(PHASE) prepare $(MAKE) --no-print-directory -j2 --output-sync=target prepare-kube-bins prepare-images
	@$(PHASE) pytest $(MAKE) --no-print-directory -j2 --output-sync=target test-lane-cluster lint-then-rest
	@$(PHASE) leftovers bash scripts/check-leftovers.sh

# Before the suite, side by side: the Go builds (compiling) beside the tests' S3 and GCS
# stores (two small Go builds), the venv and then the images the cluster scenarios run
# (mostly downloads and unpacking), so the cluster lane finds every image layer cached
# instead of building them on its critical path. Both need what `services` installs (runc
# links libseccomp; the images need dockerd and debootstrap).
prepare-kube-bins:
	@$(PHASE) kube-bins $(MAKE) --no-print-directory kube-bins

prepare-images:
	@$(PHASE) object-stores sh -c \
	  'bash scripts/build-gofakes3.sh >/dev/null && bash scripts/build-fake-gcs-server.sh >/dev/null'
	@$(PHASE) venv $(MAKE) --no-print-directory venv
	@$(PHASE) images $(MAKE) --no-print-directory test-images

test-images: venv ## Build the images the cluster scenarios run (tag `test`) into the Docker layer cache
	@PYTHONPATH=e2e $(PY) -m localkube images $(LANE_BASETEMP)/images

# The suite in two lanes side by side (see conftest.py): the cluster's and Docker's tests spend
# most of their time waiting on pods, the rest on the CPU. Each lane's output is printed whole
# when it ends, with its timing and its slowest tests. The rest lane holds a lock file while it
# runs; the cluster scenarios that measure a pod's own CPU (quiet_host) wait for it.
LANE_BASETEMP := /tmp/kvrank-tests

test-only: ## Run the test suite only (services are started by fixtures)
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-lane-cluster test-lane-rest

# In `make test`, lint runs in the rest lane's slot, before its tests: that lane ends long
# before the cluster lane, so lint's minute is off the suite's critical path.
lint-then-rest:
	@$(PHASE) lint $(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory test-lane-rest

# A lane starts from an empty temp dir: mounts a killed run left there (a Docker engine's
# network namespace) are unmounted first, or pytest could not clear it.
test-lane-cluster test-lane-rest: test-lane-%:
	@findmnt -rn -o TARGET | { grep -F "$(LANE_BASETEMP)/$*/" || true; } | sort -r | xargs -r umount -l
	@mkdir -p $(LANE_BASETEMP)
	@$(PHASE) pytest-$* env KVRANK_KUBE_BIN="$$(bash e2e/localkube/build.sh)" \
	  KVRANK_CPU_LANE_LOCK=$(LANE_BASETEMP)/cpu-lane.lock \
	  KVRANK_NODE_BIN="$$(bash e2e/localkube/build-node.sh)" \
	  $(PY) -m pytest -q --lane $* --basetemp $(LANE_BASETEMP)/$* --durations=15 --durations-min=20 $(LANE_ARGS_$*)

# The modules whose tests involve timing: concurrent actors, spikes, deadlines, proxies,
# leases (CONTRIBUTING.md says what each asserts and why that holds at any speed).
# `make test-stress` runs them in the usual two lanes with STRESS_BUSY more cores kept busy,
# STRESS_RUNS times in a row, and stops at the first red run.
STRESS_REST := ranker/tests/test_loadtest.py ranker/tests/server/test_overload.py \
  ranker/tests/server/test_api.py ranker/tests/server/test_probes.py \
  ranker/tests/server/test_shared_cache.py ranker/tests/server/test_prefetch.py \
  ranker/tests/server/test_shadow.py ranker/tests/cache/test_tiered.py \
  operator/tests/test_router.py operator/tests/test_queue_proxy.py
STRESS_CLUSTER := e2e/test_routing.py operator/tests/test_leader_election.py
STRESS_BUSY ?= 1
STRESS_RUNS ?= 5

test-stress: venv services kube-bins ## The timing-sensitive modules, STRESS_RUNS (5) times in a row, beside STRESS_BUSY (1) busy cores
	@$(MAKE) --no-print-directory test-images
	@bash scripts/stress.sh "$(STRESS_BUSY)" "$(STRESS_RUNS)" $(MAKE) --no-print-directory -j2 \
	  --output-sync=target test-lane-cluster test-lane-rest \
	  LANE_ARGS_cluster="$(STRESS_CLUSTER)" LANE_ARGS_rest="$(STRESS_REST)"

# The inner loop: lint, then every test that needs no cluster, no Docker and is not marked
# slow (a few seconds or more each); `make test` runs everything.
check: venv services ## Lint and the fast tests (no cluster, no Docker, not slow), in minutes
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint && \
	$(PY) -m pytest -q --lane rest -m "not slow" --basetemp $(LANE_BASETEMP)/check \
	  --durations=10 --durations-min=5 $(CHECK_ARGS); rc=$$?; \
	echo "make check: $$( ((rc == 0)) && echo passed || echo FAILED) in $$(( $$(date +%s) - start ))s"; \
	exit $$rc

e2e: venv services kube-bins ## The end-to-end scenarios on the local cluster's real node (part of make test)
	KVRANK_KUBE_BIN="$$(bash e2e/localkube/build.sh)" KVRANK_NODE_BIN="$$(bash e2e/localkube/build-node.sh)" \
	  $(PY) -m pytest -q -m e2e e2e

e2e-kind: venv ## The end-to-end scenarios on kind (needs Docker, kind, kubectl, helm): builds and loads the images
	@for tool in docker kind kubectl helm; do command -v $$tool >/dev/null || \
	  { echo "make e2e-kind needs '$$tool' on PATH"; exit 2; }; done
	@docker info >/dev/null 2>&1 || { echo "make e2e-kind needs a running Docker engine (docker info failed)"; exit 2; }
	KVRANK_CLUSTER=kind $(PY) -m pytest -q -m e2e e2e

demo: venv ## Train or load the small model and show what the cache saves
	$(VENV)/bin/kvrank demo

train: venv ## Train the quick model into artifacts/quick
	$(VENV)/bin/kvrank train --out artifacts/quick

train-movielens: venv ## Train and evaluate the built-in and the example plugin model on MovieLens-100k (fetched once; ~40 min on 2 CPUs): reports/movielens-100k*.json
	$(VENV)/bin/kvrank train --data movielens-100k --steps 1500 --batch-users 64 --time-budget 1800 \
	  --out artifacts/movielens-100k --json reports/movielens-100k.json --plot reports/movielens-100k-ttl.png
	$(PY) -m kvrank_sasrec.movielens --out artifacts/sasrec-movielens --json reports/movielens-100k-sasrec.json

bench: venv ## Quick benchmark (CPU, < 1 min): reports/bench-quick.{json,png}
	$(VENV)/bin/kvrank bench --profile quick --json reports/bench-quick.json --plot reports/bench-quick.png

bench-routing: venv ## Routed vs unrouted (4 pods, Envoy) and the host tier, side by side: reports/bench-routing.json
	PYTHONPATH=benchmarks $(VENV)/bin/python benchmarks/bench_routing.py --profile quick --json reports/bench-routing.json

bench-overload-front: venv ## One ranker under a 4x spike, alone and behind a queue proxy (Envoy), side by side: reports/bench-overload-front.json
	PYTHONPATH=benchmarks $(VENV)/bin/python benchmarks/bench_overload_front.py --json reports/bench-overload-front.json

bench-redis-fault: venv ## Three rankers, one and three processes each, through a Redis killed, restarted empty and half forged: reports/bench-redis-fault.json
	PYTHONPATH=benchmarks $(VENV)/bin/python benchmarks/bench_redis_fault.py --json reports/bench-redis-fault.json

bench-wire: venv ## A production-size L1 hit with its history as JSON and by reference, side by side: reports/bench-wire.json
	PYTHONPATH=benchmarks $(VENV)/bin/python benchmarks/bench_wire.py --json reports/bench-wire.json \
	  $(if $(WIRE_BASELINE),--baseline $(WIRE_BASELINE))

bench-batching: venv ## One ranker under 32 callers: one request per pass, a 2 ms window, continuous batching, side by side: reports/bench-batching.json
	PYTHONPATH=benchmarks $(VENV)/bin/python benchmarks/bench_batching.py --json reports/bench-batching.json \
	  $(if $(BATCH_BASELINE),--baseline $(BATCH_BASELINE))

bench-triton: venv ## kvrank serve's front against Triton Inference Server's, the same engine behind both, side by side: reports/bench-triton-front.json
	PYTHONPATH=benchmarks $(VENV)/bin/python benchmarks/bench_triton_front.py --json reports/bench-triton-front.json

bench-cuda: venv ## Every GPU measurement in one go (minutes on one GPU): reports/cuda/*.json
	PYTHON=$(VENV)/bin/python bash benchmarks/cuda.sh reports/cuda

bench-production: venv ## Production-size benchmark (minutes on CPU): reports/bench-production.{json,png}
	$(VENV)/bin/kvrank bench --profile production --json reports/bench-production.json --plot reports/bench-production.png

cluster-up: venv services kube-bins ## Start the local cluster with its real node (root; no Docker); prints export KUBECONFIG=…
	@PYTHONPATH=e2e $(PY) -m localkube up $(CLUSTER_DIR)

cluster-down: ## Stop the cluster started by cluster-up and restore the host's network
	@PYTHONPATH=e2e $(PY) -m localkube down $(CLUSTER_DIR)

images: ## Build the ranker, operator, redis and router images, the example plugin's ranker image, the quickstart ranker (a small model inside) and the examples' model images (needs a Docker engine; PYTHON_IMAGE= to change the base)
	@command -v docker >/dev/null && docker info >/dev/null 2>&1 || \
	  { echo "make images needs a running Docker engine (docker info failed)"; exit 2; }
	docker build $(DOCKER_BUILD_FLAGS) --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) \
	  -f images/ranker/Dockerfile -t $(REGISTRY)/ranker:$(IMAGE_TAG) .
	docker build $(DOCKER_BUILD_FLAGS) --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) \
	  -f images/operator/Dockerfile -t $(REGISTRY)/operator:$(IMAGE_TAG) .
	docker build $(DOCKER_BUILD_FLAGS) --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) \
	  -f images/redis/Dockerfile -t $(REGISTRY)/redis:$(IMAGE_TAG) images/redis
	docker build $(DOCKER_BUILD_FLAGS) --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) \
	  -f images/router/Dockerfile -t $(REGISTRY)/router:$(IMAGE_TAG) images/router
	docker build $(DOCKER_BUILD_FLAGS) --build-arg RANKER_IMAGE=$(REGISTRY)/ranker:$(IMAGE_TAG) \
	  -t $(REGISTRY)/ranker-sasrec:$(IMAGE_TAG) $(PLUGIN)
	docker build $(DOCKER_BUILD_FLAGS) --build-arg RANKER_IMAGE=$(REGISTRY)/ranker:$(IMAGE_TAG) \
	  -t $(REGISTRY)/ranker-quickstart:$(IMAGE_TAG) images/quickstart
	for version in v1 v2; do \
	  docker build $(DOCKER_BUILD_FLAGS) --build-arg MODEL_VERSION=$$version \
	    --build-arg QUICKSTART_IMAGE=$(REGISTRY)/ranker-quickstart:$(IMAGE_TAG) \
	    -t $(REGISTRY)/feed-ranker-model:$$version images/feed-ranker-model || exit 1; done
	docker build $(DOCKER_BUILD_FLAGS) --build-arg RANKER_IMAGE=$(REGISTRY)/ranker-sasrec:$(IMAGE_TAG) \
	  -f $(PLUGIN)/model.Dockerfile -t $(REGISTRY)/sasrec-model:s1 $(PLUGIN)

push-images: ## Push what `make images` built to REGISTRY and write each image's digest to RELEASE_IMAGES (needs `docker login` to REGISTRY)
	@bash scripts/push-images.sh "$(REGISTRY)" "$(IMAGE_TAG)" "$(RELEASE_IMAGES)" $(IMAGE_NAMES) $(MODEL_IMAGES)

release: venv ## dist/: the wheels (kvrank, the example plugin), the chart package (its images pinned to their digests after `make push-images`) and SHA256SUMS of the checked-out commit, byte-identical each time it is built
	@PY=$(PY) HELM="$(HELM)" IMAGE_TAG="$(IMAGE_TAG)" \
	  RELEASE_IMAGES="$$([ -f "$(RELEASE_IMAGES)" ] && echo "$(RELEASE_IMAGES)")" \
	  bash scripts/release.sh dist

helm-lint: kube-bins ## helm lint the chart with every ci/ values file
	@for f in charts/kvrank-operator/ci/*.yaml; do \
	  $(HELM) lint --strict --kube-version 1.37.2 charts/kvrank-operator -f $$f || exit 1; done

# Part of make lint: a CRITICAL finding outside lint/kube-score-ignore.yaml fails it.
kube-score: venv ## kube-score over the rendered chart and what the operator renders for every example
	$(PY) scripts/kube_score_lint.py --kube-score "$$(bash scripts/build-kube-score.sh)/kube-score" --helm "$(HELM)"

chart-readme: ## Render the chart README's parameter tables from the @param tags in values.yaml
	"$$(bash scripts/build-readme-generator.sh)/readme-generator" \
	  -v charts/kvrank-operator/values.yaml -r charts/kvrank-operator/README.md

core-types: venv ## Regenerate the Kubernetes core types the CRD embeds from the cluster release's OpenAPI document
	$(PY) scripts/core_types.py "$$(sed -n 's/^KUBE_VERSION="$${KUBE_VERSION:-\(v[0-9.]*\)}".*/\1/p' e2e/localkube/build.sh)" \
	  | $(VENV)/bin/ruff format - > operator/kvrank_operator/core_types.py.new
	mv operator/kvrank_operator/core_types.py.new operator/kvrank_operator/core_types.py

crd: venv ## Regenerate the chart's CRD and its reference page from kvrank_operator.crd
	$(VENV)/bin/kvrank-operator crd > charts/kvrank-operator/crds/rankerdeployments.yaml
	$(VENV)/bin/kvrank-operator crd --reference > docs/reference/rankerdeployment.md

clean: ## Remove the venv and generated reports
	rm -rf $(VENV) reports .pytest_cache .mypy_cache .ruff_cache
