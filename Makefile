# sglrs — the two set-up commands are `make serve` and `make test` (see README.md).
#
# One target directory serves both (release profile), kept outside the clone by default so
# that a fresh clone on the same machine reuses the compiled dependencies.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/sglrs/target
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
HOST ?= 127.0.0.1
PORT ?= 30000
SGLRS := $(CARGO_TARGET_DIR)/release/sglrs
OVERLOAD_SECONDS ?= 60
SOAK_SECONDS ?= 600
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= wire_decode transfer_proto store_segment grammar request gguf chat_template
# cargo-fuzz builds on nightly with its own flags: a target directory of its own.
# `none` (debug assertions on) or `address` (AddressSanitizer); each builds into its own folder.
FUZZ_SANITIZER ?= none
FUZZ_TARGET_DIR ?= $(HOME)/.cache/sglrs/target-fuzz-nightly-$(FUZZ_SANITIZER)
# New inputs found by `make fuzz` go here; fuzz/corpus/ (replayed by `make test`) is only read.
FUZZ_WORK ?= $(HOME)/.cache/sglrs/fuzz-corpus
SCHEMA_DIFF_SEEDS ?= 1 2 3
SCHEMA_DIFF_COUNT ?= 3000
SCHEMA_DIFF_DIR ?= $(HOME)/.cache/sglrs/schema-diff
SCHEMA_CORPUS_DIR ?= $(HOME)/.cache/sglrs/schema-corpus
# The packages whose models make the corpus, pinned so that a figure can be reproduced.
SCHEMA_CORPUS_PACKAGES ?= openai==3.63.0 anthropic==2.17.0 mcp==2.3.0 \
	mcp-server-fetch==2026.10.24 mcp-server-git==2026.10.19 mcp-server-time==2026.10.19

.PHONY: serve test deps model build lint bench-all overload soak fuzz schema-diff schema-corpus check-manifests

## Installs what is missing, fetches the default model, builds in release and starts the server.
serve: deps model build
	$(SGLRS) serve --model $(MODEL) --host $(HOST) --port $(PORT)

## Runs the whole test suite (Rust unit, integration and end-to-end tests).
test: deps model
	cargo fmt --all -- --check
	python3 scripts/check-module-cycles.py
	scripts/check-deps.sh
	python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate   # scripts/check-manifests.py: bundled Kubernetes schemas, offline
	python3 -m pip install --quiet --disable-pip-version-check openai jsonschema pytest maturin sglang-router==0.3.2 pyzmq msgpack   # jsonschema: grammar/tests/budget.rs too
	SGLRS_BIN=$(SGLRS) cargo test --release --workspace   # builds the sglrs binary (runtime/tests) the e2e tests start
	SGLRS_BIN=$(SGLRS) python3 scripts/check-manifests.py   # deploy/: schemas, probes, and every flag against the binary's --help
	python3 -m pip install --quiet --disable-pip-version-check ./python-frontend
	SGLRS_BIN=$(SGLRS) python3 -m pytest -q tests/python python-frontend/tests
	@echo "make test: all suites passed"

## Validates deploy/ offline: Kubernetes 1.30 schemas, probe routes, flags against `sglrs --help`.
check-manifests:
	python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate
	SGLRS_BIN=$(SGLRS) python3 scripts/check-manifests.py

## Open-loop arrivals at twice the measured capacity for OVERLOAD_SECONDS (60; `make test` runs 20).
overload: deps model build
	python3 -m pip install --quiet --disable-pip-version-check openai pytest
	OVERLOAD_SECONDS=$(OVERLOAD_SECONDS) SGLRS_BIN=$(SGLRS) python3 -m pytest -q -s tests/python/test_overload.py

## A mixed load for SOAK_SECONDS (600; `make test` runs 180), then checks that nothing leaked.
soak: deps model build
	python3 -m pip install --quiet --disable-pip-version-check openai pytest
	SOAK_SECONDS=$(SOAK_SECONDS) SGLRS_BIN=$(SGLRS) python3 -m pytest -q -s tests/python/test_soak.py

## Runs each cargo-fuzz target (FUZZ_TARGETS) for FUZZ_SECONDS (60) on its corpus; nightly,
## not part of `make test` (which replays the corpora). One target: `make fuzz FUZZ_TARGETS=grammar`;
## under AddressSanitizer: `make fuzz FUZZ_SANITIZER=address`.
fuzz: deps
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
	@rustup toolchain list | grep -q '^nightly' || { echo "make fuzz needs the nightly toolchain (rustup toolchain install nightly)"; exit 1; }
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_WORK)/$$t && \
		cargo +nightly fuzz run --sanitizer $(FUZZ_SANITIZER) $(if $(filter none,$(FUZZ_SANITIZER)),--debug-assertions) --target-dir $(FUZZ_TARGET_DIR) \
			$$t $(FUZZ_WORK)/$$t corpus/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 || exit 1; \
	done

## Random JSON Schemas labelled by python-jsonschema (scripts/schema_differential.py), run
## through the grammar: fails if it accepts any instance the reference validator rejects.
## SCHEMA_DIFF_SEEDS (1 2 3) × SCHEMA_DIFF_COUNT (3,000) schemas; about a minute per seed.
schema-diff: deps
	python3 -m pip install --quiet --disable-pip-version-check jsonschema
	cargo build --release -p sglrs-grammar --example jsb_coverage
	for s in $(SCHEMA_DIFF_SEEDS); do \
		d=$(SCHEMA_DIFF_DIR)/$$s && \
		python3 scripts/schema_differential.py --seed $$s --count $(SCHEMA_DIFF_COUNT) --out $$d && \
		$(CARGO_TARGET_DIR)/release/examples/jsb_coverage $$d --list $$d/verdicts.tsv | grep -E '^(overall|INVALID ACCEPTED)' && \
		! grep -P '\tINVALID_ACCEPTED' $$d/verdicts.tsv || exit 1; \
	done

## JSON Schemas of tool and API models the compiler was not tuned on (every pydantic model of
## the openai / anthropic / mcp SDKs and the reference MCP servers:
## scripts/model_schema_corpus.py), instances drawn by hypothesis-jsonschema and labelled by
## python-jsonschema; prints the coverage and fails on any invalid instance accepted. In a
## virtual environment of its own; about 30 minutes (drawing instances, two shards side by side).
schema-corpus: deps
	python3 -m venv $(SCHEMA_CORPUS_DIR)/venv
	$(SCHEMA_CORPUS_DIR)/venv/bin/pip install --quiet --disable-pip-version-check \
		hypothesis==6.100.0 hypothesis-jsonschema==0.23.1 "jsonschema[format-nongpl]==4.26.0" \
		$(SCHEMA_CORPUS_PACKAGES)
	cargo build --release -p sglrs-grammar --example jsb_coverage
	rm -f $(SCHEMA_CORPUS_DIR)/Models*.tar.gz
	for i in 0 1; do \
		$(SCHEMA_CORPUS_DIR)/venv/bin/python scripts/model_schema_corpus.py --out $(SCHEMA_CORPUS_DIR) --shard $$i/2 & \
	done; wait
	test -f $(SCHEMA_CORPUS_DIR)/Models-0.tar.gz && test -f $(SCHEMA_CORPUS_DIR)/Models-1.tar.gz
	$(CARGO_TARGET_DIR)/release/examples/jsb_coverage $(SCHEMA_CORPUS_DIR) --list $(SCHEMA_CORPUS_DIR)/verdicts.tsv
	! grep -P '\tINVALID_ACCEPTED' $(SCHEMA_CORPUS_DIR)/verdicts.tsv

deps:
	@command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs)"; exit 1; }
	@command -v python3 >/dev/null || { echo "python3 is required"; exit 1; }

model:
	@scripts/fetch-model.sh

build: deps
	cargo build --release --bin sglrs

## fmt + clippy as CI would want them (clippy is not part of `make test`: it doubles a cold build).
lint:
	cargo fmt --all -- --check
	cargo clippy --release --workspace --all-targets -- -D warnings
