# Two commands do everything on a fresh machine: `make chat` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
UNAME_S := $(shell uname -s)
UNAME_M := $(shell uname -m)
HAS_NVIDIA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)

# What this machine can run: MLX on Apple Silicon, the CUDA build of torch on NVIDIA machines,
# otherwise the pinned CPU wheel of torch (a plain `torch` would pull a multi-GB CUDA build) plus mlx[cpu].
ifeq ($(UNAME_S),Darwin)
  TORCH_SPEC := torch
  EXTRAS := cuda,mlx,dev
else ifeq ($(HAS_NVIDIA),yes)
  TORCH_SPEC := torch
  EXTRAS := cuda,mlx,dev
else
  TORCH_SPEC := torch==2.13.0
  EXTRAS := cuda,mlx,dev
endif

.PHONY: install chat test bench demo-models clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
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

clean:
	rm -rf $(VENV)
