import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch (OpenMP) thread per test process, and per process a test starts: the suite runs one worker per
# core (pytest-xdist), and two threads per worker on shared cores ran up to 10x slower here.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# `dflash chat` and `dflash serve` compile the CPU's decode steps in the background after the first answer
# (engines/cuda/background.py): tens of seconds of a core per engine. Tests that want it ask for it.
os.environ.setdefault("DFLASH_COMPILE", "0")

from tests import tiny  # noqa: E402 - after the importorskip above


@pytest.fixture(scope="session")
def pairs(tmp_path_factory):
    """Builds (and caches per session) random tiny target/draft pairs by name."""
    built = {}

    def get(family: str, last_layer: bool = False):
        key = (family, last_layer)
        if key not in built:
            root = tmp_path_factory.mktemp(f"{family}{'-last' if last_layer else ''}")
            target = tiny.make_target(root / "target", family)
            ids = [1, 3] if last_layer else [0, 2]  # 4-layer targets: layer 3 is the last
            draft = tiny.make_draft(root / "draft", target, ids)
            built[key] = (target, draft)
        return built[key]

    return get


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """Sessions and REPL history go to a fresh data directory (DFLASH_DATA_DIR)."""
    folder = tmp_path / "data"
    monkeypatch.setenv("DFLASH_DATA_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    """Profiles and preferences (the remembered theme) go to a fresh config directory for every test:
    no test reads the user's real one, and none writes into it (a theme change in a TUI test is saved)."""
    folder = tmp_path / "config"
    monkeypatch.setenv("DFLASH_CONFIG_DIR", str(folder))
    return folder


# -- the tiny qwen3 pair the TUI tests chat with (a test file may override any of these) ----------------


@pytest.fixture(scope="module")
def pair(pairs):
    return pairs("qwen3")


@pytest.fixture(scope="module")
def engine(pair):
    """The PyTorch engine on the CPU, loaded once per test file."""
    from dflash_tui.engines import EngineConfig, load_engine

    target, draft = pair
    return load_engine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def process_engine(pair):
    """The same engine in its own process, as `dflash chat` runs it: keys are handled while it streams."""
    from dflash_tui.engines import EngineConfig
    from dflash_tui.engines.process import ProcessEngine

    target, draft = pair
    engine = ProcessEngine(EngineConfig(target=str(target), draft=str(draft), engine="cuda", device="cpu",
                                        dtype="float32"))
    yield engine
    engine.close()


@pytest.fixture
def profile(tmp_path, pair):
    return tiny.write_profile(tmp_path / "tiny.toml", *pair)
