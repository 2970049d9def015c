# Two entry points: `make run` (install, then `exatrain demo`: the whole loop on this machine in a few
# minutes) and `make test` (install, then the whole test suite; `.ci/run` calls `make test`).
#
# PYTHON is the interpreter to start from. When it is not already a virtual or conda environment,
# `make install` makes a project-local one in $(VENV) (with the system site-packages, so an installed
# torch is kept) and every target runs there; see scripts/install_env.py for each decision.
# `make check` runs the linter, then the suite, in that environment without the install step;
# `make lint` runs the linter and ruff's format check alone, `make format` rewrites the code in ruff's format.
# Versions: what constraints/exatrain.txt pins (CI and a user test the same ones); UPGRADE=1 (e.g.
# `make test UPGRADE=1`) installs the newest versions pyproject.toml allows instead. torch is never replaced.
PYTHON ?= python3
UPGRADE ?=
VENV ?= .venv
# Extra flags for `exatrain demo` in `make run`, e.g. `make run RUN_ARGS="--steps 100 --ranks 4"`. It writes
# into a new runs/demo-<time>/ (ignored by git): calib.json, plan.json, metrics.jsonl, summary.txt.
RUN_ARGS ?=
# Extra arguments for pytest, e.g. `make test PYTEST_ARGS=tests/planner`.
PYTEST_ARGS ?=
# pytest processes (pytest-xdist; 0: one process, the default): modules, and the modules sharing one launch,
# are shared out whole (tests/conftest.py). On two cores more gains nothing: the suite's background jobs already
# use the second core.
PYTEST_WORKERS ?= 0
# The interpreter of the installed environment (override to run `make check` with another one).
ENV_PYTHON ?= $$(bash scripts/install.sh --print-python)

export PYTHON VENV UPGRADE

.PHONY: install run test check lint format bench check-exports

# `make check-exports`: every export-config export of the plan matrix through the engines' own parsers and model
# builders (scripts/check_exports.py): DeepSpeed 0.19.8, torchtitan 0.2.2 and 0.3.0 are pip-installed into venvs under
# EXPORT_VENVS; Megatron-LM and Megatron-DeepSpeed are not on PyPI (the megatron-core wheel holds no megatron/training),
# so they come from MEGATRON_LM / MEGATRON_DEEPSPEED: a checkout, or a git URL with an optional @commit (defaults: their
# GitHub repositories at d98e8a64 / 4efb479d). EXPORT_CHECK_ARGS passes more, e.g. "--markdown out.md".
EXPORT_VENVS ?= $(HOME)/.cache/exatrain/engines
MEGATRON_LM ?=
MEGATRON_DEEPSPEED ?=
EXPORT_CHECK_ARGS ?=

# What ruff checks and formats (its settings: [tool.ruff] in pyproject.toml).
LINT_PATHS ?= src tests benchmarks scripts

install:
	@bash scripts/install.sh

run: install
	@py="$(ENV_PYTHON)" && "$$py" -m exatrain demo $(RUN_ARGS)

test: install
	@$(MAKE) --no-print-directory check

# The linter, then the suite, in the installed environment, without installing first. pytest's exit
# status 5 ("no tests ran") fails the target, with a line saying so.
check: lint
	@py="$(ENV_PYTHON)" && "$$py" -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make: pytest ran no tests (exit status 5): that is a failure" >&2; fi; \
	exit $$rc

lint:
	@py="$(ENV_PYTHON)" && "$$py" -m ruff check $(LINT_PATHS) && "$$py" -m ruff format --check $(LINT_PATHS)

format:
	@py="$(ENV_PYTHON)" && "$$py" -m ruff format $(LINT_PATHS)

bench: install
	@py="$(ENV_PYTHON)" && "$$py" benchmarks/search_speed.py

check-exports: install
	@py="$(ENV_PYTHON)" && "$$py" scripts/check_exports.py --venvs "$(EXPORT_VENVS)" \
		$(if $(MEGATRON_LM),--megatron-lm "$(MEGATRON_LM)") $(if $(MEGATRON_DEEPSPEED),--megatron-deepspeed "$(MEGATRON_DEEPSPEED)") \
		$(EXPORT_CHECK_ARGS)
