# Two commands matter: `make demo` (the main job: the resharding benchmark) and `make test`.
# `make check` tests an install in seconds (no root); targets on the emulated cluster need
# root: `sudo make bench-all` and the others below.
# Both create .venv and install the package with its dev extras when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install sysdeps demo test bench bench-emulated clean check reference reference-check \
	cluster-up cluster-down cluster-status bench-all bench-weight-sync train-emulated

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The emulated cluster needs iproute2 (ip, tc). Installed when missing and we are root;
# without root its tests are skipped with the reason.
sysdeps:
	@if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing iproute2 for the emulated cluster"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; \
	  else echo "note: iproute2 missing and not root: emulated-cluster tests will be skipped"; fi; \
	fi

# The main job: the n-to-m microbenchmark, every method side by side on real processes. On
# an emulated cluster (shaped NICs) when run as root with iproute2, else on a local Ray
# cluster, where every link is loopback and NIC effects cannot show.
DEMO_CLUSTER := $(shell if [ "$$(id -u)" = 0 ] && command -v ip >/dev/null && command -v tc >/dev/null; then echo emulated; else echo local; fi)

demo: $(STAMP) sysdeps
	@if [ "$(DEMO_CLUSTER)" = local ]; then echo "note: not root or no iproute2: running on a local Ray cluster; NIC effects need the emulated one (sudo make demo)"; fi
	$(BIN)/alpa-comm bench --suite n-to-m --cluster $(DEMO_CLUSTER) --size-mb 16 --repeat 3 --out out/demo
	$(BIN)/alpa-comm simulate --suite n-to-m --out out/demo/sim > /dev/null
	@echo "Measured: out/demo/results.md and out/demo/n_to_m.png; simulated at the paper's 10 Gbit/s: out/demo/sim/n_to_m.png"

# Two workers: tests that share a machine-wide resource (the emulated cluster, a local Ray
# cluster) carry an xdist_group mark and run one at a time on one worker (tests/conftest.py).
TEST_WORKERS ?= 2
test: $(STAMP) sysdeps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

bench: $(STAMP)
	$(BIN)/python benchmarks/planner_speed.py
	$(BIN)/python benchmarks/sim_scale.py --out out/scale
	$(BIN)/python benchmarks/schedules.py

bench-emulated: $(STAMP) sysdeps
	$(BIN)/python benchmarks/runtime_1_to_m.py
	$(BIN)/python benchmarks/allreduce.py

# A check of the install that takes seconds and needs no root: plan, simulate and schedule
# with whatever extras .venv has (no install step: it checks what you installed).
check:
	@test -x $(BIN)/alpa-comm || { echo "no $(BIN)/alpa-comm: python3 -m venv $(VENV) && $(BIN)/pip install -e ."; exit 2; }
	$(BIN)/alpa-comm plan --shape 1024,1024,16 --src-mesh 2x4@0,1 --src-spec S0RR --dst-mesh 2x4@2,3 --dst-spec S01RR > /dev/null
	$(BIN)/alpa-comm simulate --suite n-to-m --alpa-baseline model > /dev/null
	$(BIN)/alpa-comm schedule --compare --stages 4 --microbatches 8 > /dev/null
	@echo "check passed: the planner, the simulator and the schedules run"

# docs/cli.md and docs/api.md, generated from the argument parser and the docstrings.
reference: $(STAMP)
	$(BIN)/python tools/gen_reference.py

reference-check: $(STAMP)
	$(BIN)/python tools/gen_reference.py --check

# Commands on the emulated cluster need root (network namespaces, tc): `sudo make TARGET`.
# Each runs the venv's own alpa-comm, which sudo finds by its path (sudo resets PATH).
NEEDS_ROOT = @if [ "$$(id -u)" != 0 ]; then echo "make $@ needs root (the emulated cluster: network namespaces, tc): sudo make $@"; exit 2; fi

cluster-up: $(STAMP) sysdeps
	$(NEEDS_ROOT)
	$(BIN)/alpa-comm cluster up --hosts $(HOSTS) --nic $(NIC)

cluster-down: $(STAMP)
	$(NEEDS_ROOT)
	$(BIN)/alpa-comm cluster down

cluster-status: $(STAMP)
	$(BIN)/alpa-comm cluster status

HOSTS ?= 5
NIC ?= 400mbit

# The main benchmark: every suite, every method, on 5 emulated hosts x 4 devices.
bench-all: $(STAMP) sysdeps
	$(NEEDS_ROOT)
	$(BIN)/alpa-comm bench --suite all --size-mb 32 --repeat 3 --out out/bench

# The weight sync in six JAX processes of their own on emulated hosts.
bench-weight-sync: $(STAMP) sysdeps
	$(NEEDS_ROOT)
	$(BIN)/alpa-comm bench --suite weight-sync --mode processes --cluster emulated --nic $(NIC) --size-mb 32 \
	    --repeat 5 --out out/weight-sync

# GPT trained through a pipeline on emulated hosts, each capped at half a core.
train-emulated: $(STAMP) sysdeps
	$(NEEDS_ROOT)
	$(BIN)/alpa-comm train --cluster emulated --nic $(NIC) --host-cpus 0.5 --model gpt --steps 50 --out out/train

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
