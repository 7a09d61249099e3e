import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tests import tiny  # noqa: E402


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
