# Two commands do everything on a fresh machine: `make chat` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
UNAME_S := $(shell uname -s)
HAS_NVIDIA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)

# What this machine can run: MLX on Apple Silicon, the CUDA build of torch on NVIDIA machines,
# otherwise torch from PyTorch's CPU wheel index (a plain `torch` from PyPI is a multi-GB CUDA build),
# falling back within seconds to pip's own configuration where that index is unreachable
# (scripts/install_torch.sh), plus mlx[cpu].
ifeq ($(UNAME_S),Darwin)
  TORCH_INSTALL := $(PIP) install -q torch
else ifeq ($(HAS_NVIDIA),yes)
  TORCH_INSTALL := $(PIP) install -q torch
else
  TORCH_INSTALL := sh scripts/install_torch.sh "$(PIP)" torch==2.13.0
endif
EXTRAS := cuda,mlx,dev

.PHONY: install chat test bench demo-models smoke-pythons clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(TORCH_INSTALL)
	$(PIP) install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

chat: $(STAMP)
	$(VENV)/bin/dflash chat

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/engine_speed.py

demo-models: $(STAMP)
	$(PY) scripts/make_demo_models.py

# The oldest and newest Pythons the classifiers claim, each in a fresh venv with the MLX engine only.
SMOKE_PYTHONS ?= python3.10 python3.13
smoke-pythons:
	for py in $(SMOKE_PYTHONS); do sh scripts/smoke_python.sh $$py || exit 1; done

clean:
	rm -rf $(VENV)
