# Two commands matter: `make demo` (the main job: the resharding benchmark) and `make test`.
# Both create .venv and install the package with its dev extras when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install sysdeps demo test bench bench-emulated clean

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

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
