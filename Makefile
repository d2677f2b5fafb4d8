# One-line wrappers over nox; `make help` lists them. Arguments after `--` go through ARGS="...".
NOX ?= nox
ARGS ?=

.PHONY: help setup apply build check export status tests

help: ## list the targets (the sessions behind them: `nox -l`)
	@grep -E '^[a-z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: ## the main job: apply the series and build its CUDA kernels (nox -s apply build)
	$(NOX) -s apply build -- $(ARGS)

apply: ## apply the series on upstream at the pin
	$(NOX) -s apply -- $(ARGS)

build: ## compile every CUDA kernel instantiation the bf16 path uses
	$(NOX) -s build -- $(ARGS)

check: ## series hygiene, header lint, gitlink, apply + export round trip
	$(NOX) -s check -- $(ARGS)

export: ## regenerate series/ from the patch commits in sglang-upstream
	$(NOX) -s export -- $(ARGS)

status: ## what is applied, against which base, drift from series/
	$(NOX) -s status -- $(ARGS)

tests: ## the project's test suite
	$(NOX) -s tests -- $(ARGS)
