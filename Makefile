# Two entry points: `make run` (install, then the main job on its embedded default)
# and `make test` (install, then the whole test suite). `.ci/run` calls `make test`.
PYTHON ?= python3

.PHONY: install run test bench
install:
	PYTHON=$(PYTHON) bash scripts/install.sh

run: install
	exatrain train

test: install
	$(PYTHON) -m pytest -q

bench: install
	$(PYTHON) benchmarks/search_speed.py
