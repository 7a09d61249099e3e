"""Built-in Qwen3.5 / Qwen3.6 profiles: they load with their public ids, `dflash profile list` shows them,
and with no weights and no network the CLI names the missing repo and how to fetch it (issue 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dflash_tui.cli import main
from dflash_tui.core import profiles

# name -> (target, draft, has an [engines.mlx] target override)
QWEN35 = {
    "qwen3.5-4b": ("Qwen/Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash", False),
    "qwen3.5-9b": ("Qwen/Qwen3.5-9B", "z-lab/Qwen3.5-9B-DFlash", False),
    "qwen3.5-27b": ("Qwen/Qwen3.5-27B", "z-lab/Qwen3.5-27B-DFlash", True),
    "qwen3.5-35b-a3b": ("Qwen/Qwen3.5-35B-A3B", "z-lab/Qwen3.5-35B-A3B-DFlash", True),
    "qwen3.5-122b-a10b": ("Qwen/Qwen3.5-122B-A10B", "z-lab/Qwen3.5-122B-A10B-DFlash", True),
    "qwen3.6-27b": ("Qwen/Qwen3.6-27B", "z-lab/Qwen3.6-27B-DFlash", True),
    "qwen3.6-35b-a3b": ("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", True),
}


@pytest.fixture(autouse=True)
def user_dir(config_dir, monkeypatch):
    """An empty user config dir (conftest's config_dir), so no user profile shadows a built-in one."""
    monkeypatch.setenv("NO_COLOR", "1")
    return config_dir / "profiles"


@pytest.mark.parametrize("name", sorted(QWEN35))
def test_builtin_qwen35_profile_loads_with_public_ids(name):
    target, draft, mlx_override = QWEN35[name]
    p = profiles.load_profile(name)
    assert p.name == name and p.origin == "built-in" and p.path.name == f"{name}.toml"
    assert p.target == target and p.draft == draft and p.description
    assert p.block_size is not None and 1 <= p.block_size <= 64
    # The public Qwen3.5/3.6 drafts were trained and benchmarked with thinking on.
    assert p.thinking is True and p.draft_thinking is True
    assert p.temperature is not None and p.top_p is not None and p.max_new_tokens >= 1
    mlx = p.resolved("mlx")
    if mlx_override:
        assert mlx.target.startswith("mlx-community/") and mlx.target != target
    else:
        assert mlx.target == target  # z-lab's MLX example loads the hub checkpoint directly
    assert mlx.draft == draft
    config = p.engine_config("cuda")
    assert config.source == f"built-in profile {name}"
    assert (config.target, config.draft, config.block_size) == (target, draft, p.block_size)


def test_builtin_qwen35_profiles_validate():
    for name in QWEN35:
        path = profiles.builtin_profile_dir() / f"{name}.toml"
        assert profiles.load_profile(str(path)).target == QWEN35[name][0]  # the file itself is valid
        result = CliRunner().invoke(main, ["profile", "validate", str(path)])
        # validate also wants the models here: ok where they are cached, else the download line
        assert result.exit_code == 0 or (result.exit_code == 2 and f"hf download {QWEN35[name][0]}" in result.output), \
            result.output


def test_profile_list_json_includes_qwen35_profiles():
    result = CliRunner().invoke(main, ["profile", "list", "--json"])
    assert result.exit_code == 0, result.output
    listed = {entry["name"]: entry for entry in json.loads(result.output)}
    for name, (target, draft, _) in QWEN35.items():
        assert listed[name]["target"] == target and listed[name]["draft"] == draft


def run_offline(args, tmp_path):
    """The real CLI in a subprocess with an empty HF cache and the hub switched off."""
    home = tmp_path / "hf-home"
    home.mkdir()
    env = dict(os.environ)
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_ENDPOINT"):
        env.pop(key, None)
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(home), OMP_NUM_THREADS="1", NO_COLOR="1",
               DFLASH_CONFIG_DIR=str(tmp_path / "config"))
    env.pop("DFLASH_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "dflash_tui", *args], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)


def assert_names_missing_target(line: str):
    assert "Qwen/Qwen3.5-27B" in line
    assert "hf download Qwen/Qwen3.5-27B" in line  # how to fetch it


def test_generate_without_weights_names_the_missing_repo(tmp_path):
    result = run_offline(["generate", "--profile", "qwen3.5-27b", "--engine", "cuda", "hi"], tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert_names_missing_target(lines[0])
    assert result.stdout == ""


def test_chat_without_weights_names_the_missing_repo(tmp_path):
    commands = CliRunner().invoke(main, ["--help"]).output
    if " chat " not in commands:
        pytest.skip("`dflash chat` is not built yet")
    result = run_offline(["chat", "--profile", "qwen3.5-27b", "--plain"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    # One line says what is missing and how to get it (a progress line may precede it).
    naming = [line for line in result.stderr.splitlines() if "Qwen/Qwen3.5-27B" in line and "hf download" in line]
    assert len(naming) == 1, result.stderr
    assert_names_missing_target(naming[0])
