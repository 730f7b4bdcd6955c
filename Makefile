# The two commands of README.md, and the steps they are made of.
# Every step is idempotent: run again, it skips what is already done.

SHELL := /bin/bash
# CA bundle the notebook images trust in addition to Debian's (a TLS-intercepting proxy's CA,
# say). Defaults to this machine's bundle, so the images trust what the host trusts. Empty: none.
EXTRA_CA ?= $(firstword $(wildcard $(SSL_CERT_FILE) /etc/ssl/certs/ca-certificates.crt))
CARGO ?= cargo

.PHONY: up test setup images image build agent lint unit drills bench help

help:
	@echo "make up    - set up this machine, build, start labforge"
	@echo "make test  - set up this machine, build, run every check and test"

## Set up, build and start the product: the binary builds while the notebook images build, and
## labforge serves once JupyterLab's image is there (code-server's joins in the background).
up:
	scripts/setup --product
	EXTRA_CA="$(EXTRA_CA)" CARGO="$(CARGO)" scripts/up

## Everything CI runs: setup, images, lints, the whole suite.
test: setup images lint agent
	$(CARGO) nextest run --workspace --no-fail-fast

setup:
	scripts/setup

## The benchmarks (bench/README.md), after installing their peers and tools (bench/setup).
bench: setup
	bench/setup
	$(CARGO) bench

## The notebook images, each rebuilt only when its recipe changed.
images: setup
	images/build jupyterlab $(if $(EXTRA_CA),--extra-ca $(EXTRA_CA))
	images/build codeserver $(if $(EXTRA_CA),--extra-ca $(EXTRA_CA))

## The image every workload of deploy/ runs, pushed as $(REGISTRY)/labforge:<version>.
## LABFORGE_BINARIES=DIR (labforge, labforge-proxy) and LABFORGE_AGENT=FILE pack binaries built
## elsewhere instead of building the release ones; PUSH_FLAGS go to skopeo copy.
VERSION := $(shell awk -F'"' '/^\[package\]/ { p = 1 } p && /^version = / { print $$2; exit }' Cargo.toml)
image:
	@test -n "$(REGISTRY)" || { echo "make image: set REGISTRY to where the image goes, e.g. make image REGISTRY=ghcr.io/labforge" >&2; exit 2; }
	@command -v skopeo >/dev/null || { echo "make image: skopeo is missing: run make setup" >&2; exit 2; }
	$(if $(LABFORGE_BINARIES),,$(CARGO) build --release --bin labforge --bin labforge-proxy)
	$(if $(LABFORGE_AGENT),,$(MAKE) agent)
	set -o pipefail; layout=$$(images/build labforge | tail -1) && \
	  skopeo copy -q $(PUSH_FLAGS) "oci:$$layout:latest" "docker://$(REGISTRY)/labforge:$(VERSION)"
	@echo "pushed $(REGISTRY)/labforge:$(VERSION); to deploy it: cd deploy && kustomize edit set image labforge=$(REGISTRY)/labforge:$(VERSION)"

## The binary make up runs: the up profile (Cargo.toml), optimized without release's long link.
build: agent
	$(CARGO) build --profile up --bin labforge

## The in-container agent, statically linked so that it runs in any notebook image.
agent:
	$(CARGO) rustc -q -p labforge-agent --profile agent --bin labforge-agent -- -C target-feature=+crt-static

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Only the tests that need no external service (fast feedback while coding).
unit:
	$(CARGO) nextest run --workspace --lib --bins

## Reliability drills (drills/README.md), each against a labforge up of its own; DRILLS=kill
## runs one. Then the long form of the suite's memory soak (300 sign-ins, 100 notebook cycles,
## 20 saves, resident memory sampled from /proc).
DRILLS ?=
drills: setup images agent
	$(CARGO) build --bin labforge
	$(CARGO) run -q -p labforge-drills -- $(DRILLS)
	$(if $(DRILLS),,LABFORGE_SOAK=full $(CARGO) nextest run --test e2e --no-fail-fast memory_soak)
