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
EXTRAS := cuda,mlx,serve,dev

.PHONY: install chat lint test test-min bench demo-models gpu-check smoke-pythons clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(TORCH_INSTALL)
	$(PIP) install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

chat: $(STAMP)
	$(VENV)/bin/dflash chat

# mypy: [tool.mypy] in pyproject.toml (the whole dflash_tui package); uncached about 45 s of one core.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# One test worker per core (pytest-xdist; tests/conftest.py gives each one torch thread); TEST_WORKERS=0
# runs in this process.
TEST_WORKERS ?= auto
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

bench: $(STAMP)
	$(PY) benchmarks/engine_speed.py

demo-models: $(STAMP)
	$(PY) scripts/make_demo_models.py

# The prepared GPU check (scripts/gpu_check.py): CUDA-only tests, gpu_speed at three bucket sizes, bf16
# graph-vs-eager ids on the demo pair; one JSON and one Markdown table under GPU_CHECK_OUT. About 5 minutes.
GPU_CHECK_OUT ?= gpu-check
gpu-check: $(STAMP)
	$(PY) scripts/gpu_check.py --out $(GPU_CHECK_OUT)

# The lowest versions pyproject.toml admits (uv's lowest-direct resolution) in .venv-min, then a smoke
# subset. TORCH_MIN: the torch requirement to install (default `torch`, resolved like the rest: from PyPI
# that is the multi-GB CUDA build). On a CPU machine pass a wheel you have, e.g.
#   make test-min TORCH_MIN="torch @ file:///path/to/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
TORCH_MIN ?= torch
SMOKE_MIN := tests/test_cli_generate.py tests/test_engine_contract.py tests/test_profiles.py tests/test_sessions.py tests/test_hardening.py
test-min:
	$(PYTHON) -m venv .venv-min
	.venv-min/bin/pip install -q uv
	.venv-min/bin/uv pip install -q --python .venv-min/bin/python --resolution lowest-direct "$(TORCH_MIN)" ".[cuda,serve,dev]"
	OMP_NUM_THREADS=1 .venv-min/bin/python -m pytest -q -p no:cacheprovider $(SMOKE_MIN)

# The Pythons the classifiers claim, each in a fresh venv with the MLX engine only (give full paths,
# e.g. SMOKE_PYTHONS="$$HOME/.pyenv/versions/3.10.13/bin/python3 ...", where pyenv shims hide them).
SMOKE_PYTHONS ?= python3.10 python3.12 python3.13
smoke-pythons:
	for py in $(SMOKE_PYTHONS); do sh scripts/smoke_python.sh $$py || exit 1; done

clean:
	rm -rf $(VENV) .venv-min
