# kvpool developer entry points. Everything runs from a private virtual environment in .venv,
# created on first use from pyproject.toml, so a fresh machine needs only python3.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
EXTRAS  ?= dev,fast,redis,s3,plot,ha
STAMP   := $(VENV)/.installed-$(shell echo '$(EXTRAS)' | tr ',' '-')

.PHONY: run test test-mooncake check bench clean venv

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	@touch $@

venv: $(STAMP)

## The main job: the embedded pool plus an end-to-end prefill/decode KV-cache workload.
run: $(STAMP)
	$(BIN)/kvpool demo

## The whole test suite (real processes on loopback ports; redis-server when installed).
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

## Format, lint, types, import contracts.
check: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH scripts/check

bench: $(STAMP)
	$(BIN)/kvpool bench compare

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache

## The compatibility suite against the real Mooncake wheel too (its client binds all interfaces,
## so this is opt-in; needs Debian's libibverbs1 librdmacm1 libnuma1).
test-mooncake:
	$(MAKE) EXTRAS=dev,fast,redis,s3,plot,bench venv
	KVPOOL_TEST_REAL_MOONCAKE=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/compat
