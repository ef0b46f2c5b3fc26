# Two commands do all set-up: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup test demo bench gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# pytest exits 5 when it collects no tests; that is a failure of the suite, not a pass.
# Two workers (pytest-xdist); each end-to-end model stays on one worker (--dist loadgroup).
test: setup
	$(BIN)/pytest -n 2 --dist loadgroup

demo: setup
	PATH=$(CURDIR)/$(BIN):$$PATH bash tests/demo.sh

# The benchmarks time runs, not builds: they keep their kernels in the user's build cache (or
# TILEKIT_CACHE), where the test suite builds into a folder of its own per run.
bench: setup
	TILEKIT_CACHE=$${TILEKIT_CACHE:-$$HOME/.cache/tilekit} PATH=$(CURDIR)/$(BIN):$$PATH \
	  $(BIN)/pytest tests/bench -p no:cacheprovider -o addopts="" -s

# On a machine with a GPU: everything that needs one, into out/gpu-check (see the script).
# It uses the system python3 (CuPy, PyTorch, onnxruntime installed) and creates no venv,
# because the lent GPU machines have no package registry.
gpu-check:
	PYTHONPATH=$(CURDIR) python3 tests/gpu/gpu_check.py --out out/gpu-check

clean:
	rm -rf $(VENV) build *.egg-info
