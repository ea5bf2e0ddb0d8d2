# ackline — two commands matter: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | md5sum | cut -c1-8)
PYTEST_ARGS ?=

.PHONY: install constraints demo test unit integration lint up down status clean chaos chaos-infra chaos-side-by-side bench bench-backlog decode-diff

# Every package is pinned by constraints.txt, which the Dockerfile uses too.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,faust]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

## Re-pin constraints.txt to what .venv holds now (after changing pyproject.toml's dependencies:
## install without the old pins first, e.g. `.venv/bin/pip install -U -e '.[dev,faust]'`).
constraints:
	@{ sed -n '1,3p' constraints.txt; $(BIN)/pip freeze --disable-pip-version-check \
	  | grep -v -i -e '^-e' -e '^#' -e '^ackline'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

## The main job end to end: stack up, migrate, produce 100k mixed events, ingest, verify, stack down.
demo: install
	$(BIN)/ackline demo

## Lint, then every test against a real Kafka broker and PostgreSQL (started and stopped here),
## on two pytest-xdist workers with a stack each: ~19 min on two cores at the host's usual speed
## (26-30 on a host running 2.5x slow; three workers were tried and not kept:
## docs/development.md), against ~24 in one process (TEST_WORKERS=0).
TEST_WORKERS ?= 2
test: install lint
	$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup) $(PYTEST_ARGS)

## Prove the guarantees under chaos: 1M events, 3 workers, 12 partitions, >= 30 SIGKILLs,
## 3 zombies, 2 broker and 2 PostgreSQL restarts, 10 COMMITs cut, a retention drop of the
## partition being written and an erasure (docs/retention.md); on its own stack
## (.ackline/chaos). SEED=n reproduces a run; CHAOS_ARGS passes more options.
SEED ?=
CHAOS_ARGS ?=
chaos: install
	$(BIN)/ackline chaos $(if $(SEED),--seed $(SEED)) $(CHAOS_ARGS)

## The same proof under infrastructure faults (docs/faults.md): 1M events, 3 workers, each behind
## its own fault proxies; black holes, resets and latency on their links, a 3-broker cluster
## (leader SIGKILLs, a rolling restart), PostgreSQL failovers (sync, then async losing commits),
## a full disk; on its own stack (.ackline/chaos-infra). Needs root (tmpfs) and Go (Toxiproxy).
chaos-infra: install
	$(BIN)/ackline chaos --faults network,cluster,failover,disk $(if $(SEED),--seed $(SEED)) $(CHAOS_ARGS)

## The asynchronous failover, side by side with Kafka Connect + Debezium JDBC sink (docs/faults.md):
## same data at the same rate, one failover losing commits; what each lost or duplicated.
## SBS_EVENTS=... to size (default 200,000); its own stack (.ackline/chaos-side-by-side).
SBS_EVENTS ?= 200000
chaos-side-by-side: install
	$(BIN)/python -m ackline.load.chaos.sidebyside $(SBS_EVENTS) $(SEED)

## The decoder's differential test in full: its fast path against the reference decoder
## over ~1.1M generated and hostile inputs (~15 min; `make test` runs a sample).
## DIFF_ARGS passes options (--scale, --seed, --out FILE).
DIFF_ARGS ?=
decode-diff: install
	$(BIN)/python -m tests.support.decode_diff $(DIFF_ARGS)

unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: install
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

up: install
	$(BIN)/ackline dev up
down: install
	$(BIN)/ackline dev down
status: install
	$(BIN)/ackline dev status

clean: down
	rm -rf .ackline

## Throughput beside the COPY limit and three peers, replay, latency, a flood of 1 MiB records
## and 1 ms of round trip through Toxiproxy (1M events, 30-50 min): load/bench/results.* and the
## block of docs/performance.md. Its own stack (.ackline/bench); peers (pip, Maven) and
## Toxiproxy (go install) installed by the bench itself into caches. BENCH_EVENTS=... to size.
bench: install
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[bench]'
	$(BIN)/python -m ackline.load.bench

## One worker drains a 10M-event backlog while its RSS is sampled (~1 h): load/bench/backlog.json;
## then its ingest rate with 0, 10M and 30M events stored (~30 min on 2 cores, ~21 GB of disk):
## load/bench/backlog_curve.json. BACKLOG_ARGS="--part curve" runs the curve only.
BACKLOG_ARGS ?=
bench-backlog: install
	$(BIN)/python -m ackline.load.bench.backlog $(BACKLOG_ARGS)
