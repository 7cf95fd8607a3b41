# One door for every job; each target runs one script of scripts/ (read them for the
# settings they take). `make` alone lists them.
.DEFAULT_GOAL := help
.PHONY: help demo demo-postgres setup test-fast test edition lint package package-sqlite package-sql package-rls rls reference bench soak chaos

help: ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ printf "  make %-16s %s\n", $$1, $$2 }'

demo: ## the main job: build the SQLite extension and walk through limits, refusals and a budget
	bash scripts/demo.sh

demo-postgres: ## the same walk on PostgreSQL 15 (as root; a throwaway cluster)
	bash scripts/demo.sh --postgres

setup: ## install what the build and the tests need (as root; idempotent)
	bash scripts/setup.sh --pg

test-fast: ## the core's tests and the SQLite client tests: no root, no PostgreSQL; under a minute once built
	bash scripts/test.sh --fast

test: ## everything CI runs after the lint (as root; installs what it needs)
	bash scripts/test.sh

edition: ## the SQL edition against the native extension: 10,000 random calls on a local cluster, and its suite
	bash scripts/test.sh --edition

lint: ## cargo fmt --check and clippy -D warnings on every crate
	bash scripts/lint.sh

package: ## every package into dist/: .debs and tarballs per major, the SQL edition, SQLite and web packages
	bash scripts/package.sh

package-sqlite: ## the SQLite extension's and the web packages alone (no cargo-pgrx, no PostgreSQL)
	bash scripts/package.sh --sqlite

package-sql: ## the SQL edition's two files alone (seconds)
	bash scripts/package.sh --sql

package-rls: ## ratelimit-rls's .deb alone (Envoy's rate limit service; cargo, no PostgreSQL)
	bash scripts/package.sh --rls

rls: ## ratelimit-rls on SQLite with the example configuration (gRPC 127.0.0.1:8081, metrics 127.0.0.1:8080)
	CARGO_TARGET_DIR=target/rls cargo run --release -p ratelimit-rls -- --config rls/config/examples --database sqlite:rls.db --grpc 127.0.0.1:8081 --http 127.0.0.1:8080

reference: ## rewrite the generated files (docs/reference.md, pg_finalize.sql, the Node Limit type, the spec's limit schema, the operator page's kinds) from the function and kind tables (a test fails while one is stale)
	RL_BLESS=1 cargo test -q -p ratelimit_codegen --test generated

bench: ## the benchmark harness (about 45 minutes; RL_BENCH_ONLY=targets|memory|kinds|edition|instructions for one section)
	bash scripts/bench.sh

soak: ## 1,000,000 keys on both engines, then swept while another connection takes (about 5 minutes)
	bash scripts/soak.sh

chaos: ## clients under killed backends, restarts, a stopped pgbouncer, the memory store and the web packages (about 20 minutes; RL_CHAOS_SECONDS)
	bash scripts/chaos.sh
