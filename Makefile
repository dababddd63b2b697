# Two commands matter: `make demo` (the main job) and `make test` (the suite).
# Both create .venv and install the package with its dev extras when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install sysdeps demo test bench clean

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

demo: $(STAMP)
	$(BIN)/alpa-comm plan --shape 1024,1024,16 --src-mesh 2x4@0,1 --src-spec RS0R --dst-mesh 2x4@2,3 --dst-spec S0RR
	$(BIN)/alpa-comm simulate --suite n-to-m --out out/demo
	$(BIN)/alpa-comm simulate --suite 1-to-m --out out/demo
	@echo "Tables and PNGs: out/demo/ (n_to_m.png, 1_to_m.png)"

test: $(STAMP) sysdeps
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/planner_speed.py
	$(BIN)/python benchmarks/sim_scale.py
	$(BIN)/python benchmarks/schedules.py
	$(BIN)/python benchmarks/runtime_1_to_m.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
