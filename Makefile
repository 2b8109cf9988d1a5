# starlease — see README.md. Go 1.26 is expected at /usr/local/go.
export PATH := /usr/local/go/bin:$(PATH)

GO       ?= go
FUZZTIME ?= 15s
FUZZ_TARGETS := FuzzNormalizeIdentifier FuzzCanonicalLockKey FuzzDecodeRecord FuzzDecodeHistoryEntry

STATICCHECK_VERSION ?= v0.8.2
STATICCHECK := $(or $(STARLEASE_CACHE_DIR),/var/cache/starlease)/staticcheck-$(STATICCHECK_VERSION)/staticcheck

.PHONY: build test vet staticcheck fmt-check bench fuzz demo ci

build:
	$(GO) build -o bin/starlease ./cmd/starlease

test:
	$(GO) test -race -count=1 -timeout 20m ./...

vet:
	$(GO) vet ./...

staticcheck:
	@test -x $(STATICCHECK) || GOBIN=$(dir $(STATICCHECK)) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(STATICCHECK) ./...

fmt-check:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# One table: starlease bolt, valkey and etcd beside etcd's Mutex, redislock
# and each server's floor, at 1 and 50 goroutines, three interleaved rounds
# (STARLEASE_BENCH_ROW, STARLEASE_BENCH_ROUNDS, STARLEASE_BENCH_ONLY).
bench:
	$(GO) test ./internal/benchcmp -run '^$$' -bench Peers -benchtime 1x -timeout 60m

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "== $$t ($(FUZZTIME))"; \
		$(GO) test ./lease -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME); \
	done

demo:
	./scripts/demo-local.sh

ci:
	./.ci/run
