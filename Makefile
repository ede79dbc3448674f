# kvpool developer entry points. Everything runs from a private virtual environment in .venv,
# created on first use from pyproject.toml, so a fresh machine needs only python3.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
EXTRAS  ?= dev,fast,redis,s3,plot,ha
STAMP   := $(VENV)/.installed-$(shell echo '$(EXTRAS)' | tr ',' '-')
# The real-model main job needs torch and transformers (the llm extra). Plain `pip install torch`
# pulls ~3 GB of CUDA wheels on Linux; the CPU build from PyTorch's own index is ~190 MB.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
LLM_STAMP   := $(VENV)/.installed-llm

.PHONY: run test test-llm test-mooncake check bench clean venv llm native

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	@touch $@

venv: $(STAMP)

## The fused copy-and-checksum (src/kvpool/transfer/native): `pip install` builds it; this
## rebuilds it when copyhash.c changed. Without a C compiler it says so and kvpool hashes in Python.
NATIVE_SRC := src/kvpool/transfer/native/copyhash.c
NATIVE     := src/kvpool/transfer/native/_copyhash.so
$(NATIVE): $(NATIVE_SRC) | $(STAMP)
	$(BIN)/python -m kvpool.transfer.native.build --quiet

native: $(NATIVE)

## torch (CPU build) and transformers into the same venv; pip keeps the CPU torch afterwards
## because the llm extra asks for any torch.
$(LLM_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --retries 1 --timeout 60 torch --index-url $(TORCH_INDEX) \
	  || { echo "make: $(TORCH_INDEX) unreachable; torch from PyPI instead (~3 GB with CUDA)"; \
	       $(BIN)/python -m pip install -q torch; }
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS),llm]'
	@touch $@

llm: $(LLM_STAMP)

## The main job: the embedded pool, a prefill engine running a (random-weight) Llama model that
## stores its KV cache, a decode engine that reuses it and checks its logits against a recompute.
## `kvpool demo --synthetic` is the synthetic-tensor version (no torch).
run: $(LLM_STAMP) $(NATIVE)
	$(BIN)/kvpool demo

## The whole test suite (real processes on loopback ports; redis-server when installed).
# A test that fails is run once more and reported as rerun ("R", and "N rerun" in the summary):
# the suite runs real processes on 2 shared cores, where a few timing-bound tests have failed
# once in a while under load (see docs/operations.md, "The test suite"); a test that fails
# twice fails the run. The summary names the tests rerun (-rR) and the 30 slowest.
test: $(STAMP) $(NATIVE)
	$(BIN)/python -m pytest -q -p no:cacheprovider --reruns 1 --reruns-delay 2 -rfER --durations 30

## The real-model tests alone (they skip in `make test` when the llm extra is not installed).
test-llm: $(LLM_STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/llm

## Format, lint, types, import contracts.
check: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH scripts/check

bench: $(STAMP) $(NATIVE)
	$(BIN)/kvpool bench compare

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache $(NATIVE)

## The compatibility suite against the real Mooncake wheel too (its client binds all interfaces,
## so this is opt-in; needs Debian's libibverbs1 librdmacm1 libnuma1). torch and safetensors come
## with the llm target, so the tensor tests run on both backends instead of skipping.
test-mooncake: $(LLM_STAMP)
	$(MAKE) EXTRAS=dev,fast,redis,s3,plot,bench venv
	KVPOOL_TEST_REAL_MOONCAKE=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/compat

## The inference engines on kvpool (docs/engines.md): builds LMCache's, SGLang's and vLLM's
## environments once under $(ENGINES_CACHE) (~10 GB; cached between runs), then runs each
## engine's own Mooncake-backend test and kvpool's native backends against a live pool.
## `make test` skips these tests when the environments are missing.
ENGINES        ?= lmcache sglang vllm
ENGINES_CACHE  ?= $(HOME)/.cache/kvpool-engines
.PHONY: test-engines
test-engines: $(STAMP)
	@for e in $(ENGINES); do KVPOOL_ENGINES_CACHE=$(ENGINES_CACHE) scripts/engines/build $$e || exit 1; done
	KVPOOL_ENGINES_CACHE=$(ENGINES_CACHE) $(BIN)/python -m pytest -q -p no:cacheprovider -rs \
	  -o timeout=600 tests/engines
