# fgpu — `make demo` runs the main job on a local cluster; `make test` is the test suite.
SHELL := /bin/bash
GO ?= go

.PHONY: all build test test-unit fuzz test-e2e verify generate structure lint golangci-lint logcheck demo demo-down images \
	cluster-up cluster-down bench-e2e plot gpucheck gpucheck-fake gpucheck-faults gpucheck-faults-fake gpucheck-usage \
	gpucheck-usage-fake kubectl-plugin

# Developer tools run at the versions pinned in hack/tools (golangci-lint in its own module so its
# dependencies stay as its authors tested them); `go tool` builds each once into the Go cache.
TOOLS := $(GO) tool -modfile=hack/tools/go.mod
GOLANGCI_LINT := $(GO) tool -modfile=hack/tools/golangci-lint/go.mod golangci-lint

all: build

## build: every package, and the CLI as fgpu and as the kubectl plugin kubectl-fgpu into
## _output/cli (put kubectl-fgpu on the PATH: `kubectl fgpu gpus`).
build:
	$(GO) build ./...
	$(GO) build -o _output/cli/ ./cmd/fgpu ./cmd/kubectl-fgpu

## kubectl-plugin: kubectl-fgpu's release archives and krew manifest (plugins/fgpu.yaml,
## filled in) for VERSION into _output/krew.
kubectl-plugin:
	GO="$(GO)" hack/krew.sh $(VERSION)

## test: the tree checks (verify, lint), unit tests, a short fuzz run, the GPU checks' fake-GPU
## variants, then the e2e suites on a real local Kubernetes cluster; .ci/run calls this. It
## ends with the time each phase took (hack/test.sh).
test:
	MAKE="$(MAKE)" hack/test.sh

## verify: Go files formatted, every go.mod tidy, generated files up to date (hack/verify.sh).
verify:
	GO="$(GO)" MAKE="$(MAKE)" hack/verify.sh

## generate: deepcopy and the SharingPolicy CRD (into the chart) from the API types with
## controller-gen, then the typed clientset, listers and informers (hack/update-codegen.sh).
## Needs only the Go module proxy; running it twice leaves the tree unchanged.
generate:
	$(TOOLS) controller-gen object crd paths=./api/... output:crd:dir=deployments/helm/fgpu/crds
	GO=$(GO) hack/update-codegen.sh

## lint: golangci-lint (.golangci.yml) and Kubernetes' logcheck for contextual logging.
lint: golangci-lint logcheck

golangci-lint:
	$(GOLANGCI_LINT) run --allow-serial-runners ./...

logcheck:
	$(TOOLS) logcheck -check-contextual ./...

## structure: the figures the structure pass is judged by (methods per type, long files and
## functions, references between a package's files that point back up).
structure:
	cd hack/tools && go run ./structure -C ../.. ./pkg/...

## test-unit: also the plugin as the e2e image builds it (-tags fgpu_e2e: its fault hooks), and
## the GPU checks' own unit tests (e2e/gpucheck; the other e2e packages need the cluster).
test-unit:
	$(GO) vet ./...
	$(GO) vet -tags fgpu_e2e ./pkg/plugin/
	$(GO) test -count=1 $$($(GO) list ./... | grep -v '/e2e/') ./e2e/gpucheck/
	$(GO) test -count=1 -tags fgpu_e2e ./pkg/plugin/

## fuzz: each fuzz target of what tenants and admins feed fgpu (opaque GpuConfig, its merge,
## SharingPolicy, trace CSV) for FUZZTIME (about 50 s in all with a warm cache). A failing
## input lands in the package's testdata/fuzz/<Target>/: keep it there with the fix, as a
## seed that `go test` then runs every time.
FUZZTIME ?= 10s
FUZZ_TARGETS := ./api/fgpu.dev/v1alpha1:FuzzDecodeGpuConfig ./api/fgpu.dev/v1alpha1:FuzzMergeConfigs \
	./pkg/policy:FuzzSharingPolicy ./pkg/sim:FuzzReadTrace
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t##*:} for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t##*:}\$$" -fuzztime $(FUZZTIME) $${t%%:*} || exit 1; \
	done

test-e2e:
	hack/e2e.sh

## demo: a local cluster with fgpu on two fake 80Gi GPUs and four pods sharing them.
demo:
	demo/run.sh

demo-down:
	demo/down.sh

## images: the fgpu image for the local cluster, with the plugin's e2e fault hooks
## (-tags fgpu_e2e); demo and release images are built without them.
images:
	FGPU_BUILD_TAGS=fgpu_e2e e2e/cluster/images.sh fgpu

cluster-up:
	hack/install-prereqs.sh
	e2e/cluster/build.sh --cluster-only
	e2e/cluster/up.sh

cluster-down:
	e2e/cluster/down.sh

## bench-e2e: pod create→Running with and without a claim in both modes, plugin RSS at 100 claims
## (needs a cluster from `make cluster-up` and `make images`).
bench-e2e:
	go run ./e2e/cmd/podbench --mode scheduler
	go run ./e2e/cmd/podbench --mode allocator --claims 0

## plot: GPU allocation vs arrived demand on the openb default trace for random, bestfit, fgd
## and fgpu (seeds 42-51), docs/performance.md's figure; the traces sit in ../shared/traces/openb.
TRACES ?= ../shared/traces/openb
plot:
	$(GO) run ./cmd/fgpu plot --nodes $(TRACES)/openb_node_list_gpu_node.csv \
		--pods $(TRACES)/openb_pod_list_default.csv --policies random,bestfit,fgd,fgpu -o docs/placement-default.png

## gpucheck: the node side in production shape on a real NVIDIA GPU, no Kubernetes (run as root
## where a GPU and python3 with torch are): NVML, two tenants of two namespaces run as containers
## of their claims' CDI specs, caps checked by CUDA processes, the plugin killed and restarted
## under them. gpucheck-fake: the same script on fake GPUs and the MPS stand-in (in make test).
gpucheck:
	CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations $(GO) build -o _output/gpucheck/gpucheck ./e2e/gpucheck
	e2e/gpucheck/run.sh _output/gpucheck/gpucheck _output/gpucheck-out

gpucheck-fake:
	CGO_ENABLED=0 $(GO) build -o _output/gpucheck-fake/ ./e2e/gpucheck ./cmd/fake-mps-control
	e2e/gpucheck/run.sh --fake _output/gpucheck-fake/gpucheck _output/gpucheck-fake-out

## gpucheck-faults: GPU faults on a real NVIDIA GPU (about 4 min, as root, with python3 and
## torch; docs/faults.md): the plugin's health watch and MPS check run through 2 min of normal
## work (no false alarm), then one MPS client's illegal memory access beside another; prints
## what the server, the other client, a new client and the plugin saw (SEEN:).
## gpucheck-faults-fake: the same on fake GPUs and the MPS stand-in, in seconds (in make test).
gpucheck-faults:
	CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations $(GO) build -o _output/gpucheck/gpucheck ./e2e/gpucheck
	e2e/gpucheck/faults.sh _output/gpucheck/gpucheck _output/gpucheck-faults-out

gpucheck-faults-fake:
	CGO_ENABLED=0 $(GO) build -o _output/gpucheck-fake/ ./e2e/gpucheck ./cmd/fake-mps-control
	e2e/gpucheck/faults.sh --fake _output/gpucheck-fake/gpucheck _output/gpucheck-faults-fake-out

## gpucheck-usage: the plugin's usage measurement against nvidia-smi on a real NVIDIA GPU, no
## Kubernetes (root, python3 with torch; about 4 minutes): two PyTorch tenants of two claims
## under MPS on GPU 0 (6GiB steady, 2->10GiB ramping), each claim's memory within 10% of
## nvidia-smi's every poll, SM activity compared where pmon gives it, and the recommender's
## memory above each one's observed peak. gpucheck-usage-fake: the same on fake GPUs, with
## fgpu-probe replaying the patterns and the fake usage file for nvidia-smi (in make test).
gpucheck-usage:
	CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations $(GO) build -o _output/gpucheck/gpucheck ./e2e/gpucheck
	e2e/gpucheck/run-usage.sh _output/gpucheck/gpucheck _output/gpucheck-usage-out

gpucheck-usage-fake:
	CGO_ENABLED=0 $(GO) build -o _output/gpucheck-usage-fake/ ./e2e/gpucheck ./cmd/fake-mps-control ./cmd/fgpu-probe
	e2e/gpucheck/run-usage.sh --fake _output/gpucheck-usage-fake/gpucheck _output/gpucheck-usage-fake-out
