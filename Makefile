# Two commands on a fresh machine: `make demo` and `make test`. Both install what they need first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install browser demo test test-fast clean

install: $(STAMP)

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

# The dashboard tests drive Debian's chromium (through playwright, with no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: install browser
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

clean:
	rm -rf .rlvr .pytest_cache
