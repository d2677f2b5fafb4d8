# One-line wrappers over nox; `make help` lists them. Session options go through ARGS="...".
NOX ?= nox
ARGS ?=

.PHONY: help setup apply build tests check lint bisect export status verify bench rebase range-diff \
	rebase-check wheel pr-drafts live-install cost

help: ## list the targets (the sessions behind them: `nox -l`)
	@grep -E '^[a-z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: ## the main job: apply the series and build its CUDA kernels (nox -s apply build)
	$(NOX) -s apply build -- $(ARGS)

apply: ## apply the series on upstream at the pin
	$(NOX) -s apply -- $(ARGS)

build: ## compile every CUDA kernel instantiation the bf16 path uses
	$(NOX) -s build -- $(ARGS)

tests: ## the project's test suite
	$(NOX) -s tests -- $(ARGS)

check: ## series hygiene, header lint, gitlink, apply + export round trip
	$(NOX) -s check -- $(ARGS)

lint: ## ruff and mypy --strict over the product's own Python
	$(NOX) -s lint -- $(ARGS)

bisect: ## every prefix of the series imports, compiles and passes its tests
	$(NOX) -s bisect -- $(ARGS)

export: ## regenerate series/ from the patch commits in sglang-upstream
	$(NOX) -s export -- $(ARGS)

status: ## what is applied, against which base, drift from series/
	$(NOX) -s status -- $(ARGS)

verify: ## recall verification (tiers 1-2; ARGS="--server URL" for the live tier)
	$(NOX) -s verify_recall -- $(ARGS)

bench: ## kernel benchmarks on a CUDA GPU
	$(NOX) -s bench -- $(ARGS)

rebase: ## carry the series to a newer upstream (ARGS="0.5.23", "--continue", "--abort")
	$(NOX) -s rebase -- $(ARGS)

range-diff: ## classify each patch against a carried series (ARGS="--upstream 0.5.23")
	$(NOX) -s range_diff -- $(ARGS)

rebase-check: ## try the series on newer releases; check every carried series still applies
	$(NOX) -s rebase_check -- $(ARGS)

wheel: ## a patched sglang wheel for pip (build/wheel/)
	$(NOX) -s wheel -- $(ARGS)

pr-drafts: ## upstream PR drafts (build/pr-drafts/)
	$(NOX) -s pr_drafts -- $(ARGS)

live-install: ## the live tier from its extra alone (fresh venv, no torch)
	$(NOX) -s live_install -- $(ARGS)

cost: ## what each index-K format costs (KV-pool tokens, decode bytes, TTFT); no GPU
	$(NOX) -s cost -- $(ARGS)
