# Two commands for a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install what they need on their own.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch is pinned here (the CPU build); commscope itself does not depend on torch.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.commscope-installed

.PHONY: demo test test-peer test-matrix lint bench chromium faketime clean

$(STAMP): pyproject.toml setup.py Makefile commscope/analyze/read/_fastread.c commscope/flight/record/_stack.c
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test]"
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/commscope demo

test: $(STAMP) chromium faketime
	$(PY) -m ruff check .
	$(PY) -m pytest

# Browser tests need Chromium. Debian's package is installed when we are root;
# otherwise the browser tests skip with a message saying how to get it.
chromium:
	@if command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the browser tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "could not install chromium: browser tests will be skipped"; \
	else echo "chromium not found and not root: browser tests will be skipped (apt-get install chromium)"; fi

# The simulated-host clock tests (tests/hosts/test_clocks.py) put one host's clock behind
# with Debian's libfaketime; installed when we are root, else those tests skip saying why.
faketime:
	@if ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's faketime for the clock tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null) \
		|| echo "could not install faketime: the clock tests will be skipped"; \
	else echo "libfaketime not found and not root: the clock tests will be skipped (apt-get install faketime)"; fi

# PyTorch's own test files run against commscope, one import swapped (tests/peer, read from
# $(COMMSCOPE_PEER_DIR) or ../shared/peer, never copied into the project). PEER=ci (the
# default, about a minute, also part of `make test`): whole files with forked ranks plus a
# sample with torch's own harness; PEER=fork: without the sample; PEER=all: whole files
# with torch's own harness, as PyTorch runs them (40+ minutes on 2 cores). More options:
# make test-peer PEER_ARGS="--against both --suite device_mesh -k InitDeviceMeshTest"
PEER ?= ci
test-peer: $(STAMP)
	$(PY) -m tests.peer --mode $(PEER) $(PEER_ARGS)

# Not part of `make test`: the suite on every torch release from 2.6 to 2.15 (Python 3.11)
# and on 3.10 / 3.12 / 3.13 at both ends, one venv each under .venv-matrix, deleted after its run
# (PyPI's torch wheels are CUDA builds: about 5.7 GB each). Narrow it:
# make test-matrix MATRIX="--cells 3.11:2.8.0 --suite sensitive"
test-matrix: $(STAMP)
	$(PY) tests/matrix.py $(MATRIX)

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) bench/mesh_plan.py
	OMP_NUM_THREADS=1 $(PY) bench/mesh_init.py
	OMP_NUM_THREADS=1 $(PY) bench/comm_overhead.py
	OMP_NUM_THREADS=1 $(PY) bench/flight_overhead.py
	OMP_NUM_THREADS=1 $(PY) bench/analyze_scale.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
