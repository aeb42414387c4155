# rampart: the generated BPF objects are committed, so `build` needs Go only.
GO ?= go

.PHONY: build generate check-generated test lint deb kernels

# The commit rides in with -X: GOFLAGS may turn Go's own VCS stamp off.
COMMIT := $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo +modified)
LDFLAGS := -X github.com/rampart-fw/rampart/internal/cli.Commit=$(COMMIT)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o rampart ./cmd/rampart

# A Debian package in out/ (scripts/deb.sh says what it holds).
deb:
	bash scripts/deb.sh

# The compiler the committed objects were built with: another version emits
# other bytes, and check-generated would fail for no fault of bpf/.
CLANG_VERSION := 19.1.7

# Rebuilds internal/*/*_bpfel.{go,o} from bpf/ with the pinned clang. bpf2go
# reads the compiler and the flags every object shares from the environment;
# the go:generate lines add what differs by object. -nostdinc: headers come
# from bpf/include (bpf/include/update.sh), never from the build host.
generate: export BPF2GO_CC := clang-19
generate: export BPF2GO_STRIP := llvm-strip-19
generate: export BPF2GO_CFLAGS := -O2 -g -Wall -Werror -nostdinc -I$(CURDIR)/bpf/include
generate:
	@$(BPF2GO_CC) --version | grep -q "version $(CLANG_VERSION)" || \
	  (echo "make generate needs clang $(CLANG_VERSION) ($(BPF2GO_CC); scripts/setup.sh installs it)" >&2; exit 1)
	$(GO) generate ./internal/...

# Fails when the committed objects do not match bpf/.
check-generated: generate
	git diff --exit-code -- 'internal/*/*_bpfel.go' 'internal/*/*_bpfel.o' internal/abi/abi_gen.go || \
	  (echo "bpf/ and the committed objects disagree: run make generate and commit" >&2; exit 1)

# The end-to-end tests that mostly wait on daemons of their own (CrowdSec's
# LAPI, BGP speakers and their timers) run beside the kernel tier, whose
# guests only get slower, not beside the other packages' tests, some of
# which measure rates: the cli package's tests run one after another, so
# that these lengthened the longest package of the first step.
APART := ^(TestCrowdSecBouncer|TestCrowdSecBadAnswers|TestFlowSpec|TestFlowSpecBird|TestFlowSpecMalformed|TestFlowSpecScale|TestFlowSpecInterfaces)$$
# The datapath's tests of concurrent loading and flipping, which run again
# under the race detector with the packages whose code runs in pieces or
# goroutines (lists read and compiled in pieces, the spare generation, the
# daemon's handlers).
RACED := ^(TestGenerationsShareAProgram|TestSpareGeneration|TestFlipUnderFrames|TestOverlayGrows)$$

# The whole suite: formatting, tidy modules and vet, generated objects up to date, then every
# test tier; the concurrent code again under -race; the delay line's transfers last, alone on the CPUs; then the kernel tier, the same
# tests in guests of Linux 6.1 and 6.12 under qemu (scripts/kernels.sh), with the tests APART
# beside it. Privileged tiers need root; with RAMPART_REQUIRE_PRIVILEGED=1 they fail instead of
# skipping.
test: lint check-generated
	$(GO) test -count=1 -timeout 30m -skip '$(APART)' ./...
	$(GO) test -race -count=1 ./internal/policy ./internal/compile ./internal/engine ./internal/serve
	$(GO) test -race -count=1 -run '$(RACED)' ./internal/datapath
	RAMPART_DELAY_LINE=1 $(GO) test -count=1 -run 'TestDelayLine$$' -v ./internal/tune
	$(GO) test -count=1 -timeout 30m -run '$(APART)' ./internal/cli & apart=$$!; \
	  bash scripts/kernels.sh; kernels=$$?; \
	  wait $$apart && [ $$kernels -eq 0 ]

# The kernel tier alone.
kernels:
	bash scripts/kernels.sh

lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) mod tidy -diff || (echo "go.mod and go.sum are not tidy: run go mod tidy" >&2; exit 1)
	$(GO) vet ./...
