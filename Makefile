# qpdrain: `make demo` runs the main job, `make test` runs every test.
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go

.PHONY: all test deps vet build unit demo bench lint

all: build

## test: every test — vet, both builds, unit tests with -race (soft device orderly, then adversarial),
## deploy/'s manifests, then the rxe stage.
test: deps vet build unit unit-adversarial deploy-check test-rxe

## deps: install the Debian packages the build and tests need, when missing.
deps:
	@scripts/deps.sh

## vet: gofmt, go vet, no build output tracked by git (an ELF file or a file over 1 MB), and
## shellcheck's errors and warnings over the tracked shell scripts.
vet:
	@echo "== go vet"
	@scripts/check-tracked.sh
	@scripts/check-shell.sh
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt would change:"; gofmt -l .; exit 1; }
	$(GO) vet ./...

## build: the cgo and CGO_ENABLED=0 builds; for darwin and windows, go vet, which compiles what
## each package imports and type-checks every package and its tests: a build there would compile
## the same again (a Linux-only test helper belongs in a *_linux_test.go file).
build:
	@echo "== build (cgo, CGO_ENABLED=0) and go vet (darwin, windows)"
	$(GO) build ./...
	CGO_ENABLED=0 $(GO) build ./...
	GOOS=darwin $(GO) vet ./...
	GOOS=windows $(GO) vet ./...

unit:
	@echo "== go test -race"
	$(GO) test -race -count=1 ./...

## deploy-check: deploy/'s own module (its test needs the Kubernetes API's types, which qpdrain does
## not): vet, then the manifests decoded strictly into those types, offline (docs/LEAKS.md).
.PHONY: deploy-check
deploy-check:
	@echo "== deploy/: go vet, go test"
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

## unit-adversarial: the device tests again on adversarial soft devices, one seed per test (devtest),
## then devtest's and the RDMA CM's tests on soft:iwarp.
.PHONY: unit-adversarial soak
unit-adversarial:
	@echo "== go test -race, QPDRAIN_TEST_DEVICE=soft:adversarial"
	QPDRAIN_TEST_DEVICE=soft:adversarial $(GO) test -race -count=1 ./internal/testing/devtest ./internal/testing/cmtest ./drain ./flushcheck ./cmd/qpdrain ./ipoibcm ./ipoibcm/churn
	@echo "== go test -race, QPDRAIN_TEST_DEVICE=soft:iwarp (siw's rules, through softcm)"
	QPDRAIN_TEST_DEVICE=soft:iwarp $(GO) test -race -count=1 ./internal/testing/devtest ./internal/testing/cmtest

## soak: many adversarial seeds of the drain and flush-check bodies, bounded in time (SOAK_SEEDS, SOAK_TIME).
soak:
	@GO=$(GO) scripts/soak.sh

## test-rxe: the Go tests against real Soft-RoCE (kernel rdma_rxe) in qemu, on every kernel of the
## matrix (docs/TESTING.md). Outside CI it is skipped, loudly, when it cannot run on this machine.
.PHONY: test-rxe
test-rxe:
	@scripts/rxe-test.sh

## test-pyverbs: rdma-core's own test suite (Debian's python3-pyverbs) on rxe through `qpdrain vm
## run --python`, on every kernel of the matrix, with pass/skip/fail counts (docs/PROVIDERS.md).
.PHONY: test-pyverbs
test-pyverbs:
	@scripts/rxe/pyverbs.sh

## providers: record `qpdrain check --device soft -j` (and soft:iwarp) and render docs/PROVIDERS.md's check tables
## from testdata/providers (internal/providers; its test fails when they disagree).
## providers-rxe: record the check on rxe0 and siw0 per kernel of the matrix first (a VM run).
.PHONY: providers providers-rxe
providers:
	$(GO) run ./cmd/qpdrain check --device soft -j > testdata/providers/soft.json.new
	mv testdata/providers/soft.json.new testdata/providers/soft.json
	$(GO) run ./cmd/qpdrain check --device soft:iwarp -j > testdata/providers/soft-iwarp.json.new || [ $$? = 1 ]
	mv testdata/providers/soft-iwarp.json.new testdata/providers/soft-iwarp.json
	$(GO) run ./internal/providers render
providers-rxe:
	RXE_CHECK_REPLACE=1 scripts/rxe/check-record.sh testdata/providers
	$(GO) run ./internal/providers render

## demo: the main job — the provider flush check (the first RDMA device, or the soft device when
## there is none), then the SRQ-fault scenario on soft devices, then the IPoIB-CM churn of the eHCA case
## under both drain policies, with its plots.
## Findings of the check (exit 1: the device deviates) are the demo's result, not its failure.
demo: deps
	$(GO) build -o .cache/qpdrain ./cmd/qpdrain
	.cache/qpdrain check || [ $$? -eq 1 ]
	.cache/qpdrain scenario srq-fault
	.cache/qpdrain churn --quirk send-in-error-not-flushed --max-qp 128 --events 3000 --rows 10 --plot-until 60m --plot .cache/churn-kernel.png || [ $$? -eq 1 ]
	.cache/qpdrain churn --quirk send-in-error-not-flushed --max-qp 128 --events 3000 --rows 10 --plot-until 60m --plot .cache/churn-bounded.png --policy bounded
	@echo "churn plots: .cache/churn-kernel.png (ipoib_cm.c's policy: the eHCA leak), .cache/churn-bounded.png (qpdrain's)"

## demo-fleet: the fleet end to end in a VM (docs/LEAKS.md): a planted leak, the real qpdrain
## exporter over TLS with basic auth, Debian's Prometheus with the shipped rules, the leak alert
## pending, firing and resolved after qpdrain reap, the exporter-down alert; the series plotted.
.PHONY: demo-fleet
demo-fleet: deps
	FLEET_PLOT=.cache/fleet.png scripts/rxe/fleet.sh

## bench: the benchmarks behind docs/BENCH.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

## bench-rxe: the reaper against the device floor on rxe (DrainAll and the floors on 1,024 QPs, 20
## rounds a run, three runs of 6.12 and 6.1 in VMs of one vCPU), a verdict per run against 1.10x
## (docs/BENCH.md). About an hour under TCG.
.PHONY: bench-rxe
bench-rxe:
	@scripts/rxe/bench-reaper.sh
