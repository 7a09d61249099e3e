"""`dflash --version`, `dflash doctor` and shell completion: facts for a bug report, names to complete, and
whether the `dflash` on PATH is this package's (z-lab's `dflash` package installs a command of that name)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

from click.testing import CliRunner

from dflash_tui.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_doctor_names_the_frameworks_and_what_auto_picks():
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0, result.output
    lines = {line[:16].strip(): line[16:].strip() for line in result.output.splitlines()}
    assert lines["dflash-tui"] == metadata.version("dflash-tui")
    assert lines["torch"] == metadata.version("torch") and lines["transformers"] == metadata.version("transformers")
    assert "mlx" in lines and "mlx-lm" in lines
    assert lines["auto-engine"].startswith(("cuda engine", "mlx engine"))


def test_doctor_checks_a_profiles_pair(tmp_path, pairs):
    from tests.tiny import write_profile

    target, draft = pairs("qwen3")
    profile = write_profile(tmp_path / "p.toml", target, draft)
    result = CliRunner().invoke(main, ["doctor", "--profile", str(profile)])
    assert result.exit_code == 0, result.output
    assert f"target           {target} (local folder" in result.output
    assert "memory" in result.output and ": fits" in result.output
    missing = CliRunner().invoke(main, ["doctor", "--profile", "qwen3-8b"], env={"HF_HUB_OFFLINE": "1"})
    assert missing.exit_code == 0 and "Qwen/Qwen3-8B (not downloaded)" in missing.output
    assert "cannot tell" in missing.output
    assert "  needs          unknown until it is downloaded" in missing.output


def needs_of(profile) -> list[str]:
    result = CliRunner().invoke(main, ["doctor", "--profile", str(profile)])
    assert result.exit_code == 0, result.output
    return [line[16:].strip() for line in result.output.splitlines() if line.startswith("  needs")]


def test_doctor_names_what_each_family_needs(tmp_path, pairs):
    """Read from the target's config.json and headers: the framework that runs its model type, and the parts
    that change loading and decoding (a window, sinks, MXFP4 experts, linear attention, experts, towers)."""
    from tests.tiny import make_gpt_oss_mxfp4, write_profile

    def needs(family, target=None):
        target = target or pairs(family)[0]
        return needs_of(write_profile(tmp_path / f"{family}.toml", target, pairs(family)[1]))

    assert needs("qwen3") == ["model type qwen3: transformers runs it, mlx-lm runs it"]
    mxfp4 = make_gpt_oss_mxfp4(tmp_path / "mxfp4", pairs("gpt_oss")[0])
    oss = needs("gpt_oss", mxfp4)
    assert oss[0] == "model type gpt_oss: transformers runs it, mlx-lm runs it"
    assert any(line.startswith("sliding window ") for line in oss) and "attention sinks (one learned logit per head)" in oss
    assert any(line.startswith("MXFP4 experts: no CUDA device here, so they load dequantized") for line in oss)
    assert any("mixture of experts" in line for line in oss)
    assert any(line.startswith("3 linear-attention layers") for line in needs("qwen3_5"))
    assert any(line.endswith("vision/audio tower tensors: left out (neither built nor read)") for line in needs("gemma4"))


def test_doctor_asks_engines_about_the_frameworks_and_imports_none_itself():
    """Issue 46, build 9: doctor's checks (cli/needs.py) imported torch and transformers outside engines/; they
    ask engines/frameworks.py now, and no module of doctor's imports a framework or an engine's framework code
    (the lines they print are checked above)."""
    import ast
    import importlib

    for name in ("dflash_tui.cli.doctor", "dflash_tui.cli.needs"):
        module = importlib.import_module(name)
        tree = ast.parse(Path(module.__file__).read_text())
        names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        names += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
        reached = [name for name in names if name.split(".")[0] in ("torch", "transformers", "mlx", "mlx_lm")
                   or name.startswith(("dflash_tui.engines.cuda", "dflash_tui.engines.mlx"))]
        assert reached == [], (name, reached)


def test_shell_completion_offers_profile_names_and_session_ids(data_dir):
    from dflash_tui.core import sessions

    writer = sessions.SessionWriter({"profile": {"name": "x"}}, session_id="20260101-120000-comp")
    writer.append_turn({"index": 0, "status": "completed", "user": "q", "answer": "a", "settings": {}})
    writer.close()
    env = {**os.environ, "DFLASH_DATA_DIR": str(data_dir), "_DFLASH_COMPLETE": "bash_complete"}

    def complete(words: str) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "dflash_tui"], env={**env, "COMP_WORDS": words,
                             "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))},
                             capture_output=True, text=True, cwd=ROOT, timeout=120).stdout
        return [line.split(",", 1)[1] for line in out.splitlines()]

    assert "qwen3.5-27b" in complete("dflash generate --profile qwen3.5")
    assert complete("dflash sessions show 2026") == ["20260101-120000-comp"]


# Run in a fresh interpreter: `--version` must answer without loading any framework (torch alone is 1.8 s).
VERSION_ONLY = """
import sys
from dflash_tui.cli import main
code = main(["--version"], standalone_mode=False)
loaded = sorted(m for m in ("torch", "transformers", "mlx", "mlx_lm", "textual") if m in sys.modules)
print("LOADED", loaded, "CODE", code)
"""


def test_version_is_one_line_and_imports_no_framework():
    run = subprocess.run([sys.executable, "-c", VERSION_ONLY], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    version, verdict = run.stdout.splitlines()
    assert version == f"dflash-tui {metadata.version('dflash-tui')}"
    assert verdict == "LOADED [] CODE 0"


def _launcher(folder: Path, module: str, python: str = sys.executable) -> Path:
    """A console script as pip writes one, for `module:main`."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "dflash"
    script.write_text(textwrap.dedent(f"""\
        #!{python}
        # -*- coding: utf-8 -*-
        import re
        import sys
        from {module} import main
        if __name__ == "__main__":
            sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
            sys.exit(main())
        """))
    script.chmod(0o755)
    return script


def test_doctor_says_when_the_dflash_on_path_is_not_ours(tmp_path):
    foreign = _launcher(tmp_path / "bin", "dflash.cli")  # what another package's `dflash` script looks like
    env = {**os.environ, "PATH": f"{foreign.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = subprocess.run([sys.executable, "-m", "dflash_tui", "doctor"], env=env, capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("dflash command")]
    assert f"{foreign} is NOT this package's (it runs dflash.cli:main;" in line
    assert "run `dflash-tui` instead, or install the two in separate venvs" in line


def test_doctor_knows_its_own_command_and_another_installation_of_it(tmp_path):
    ours = _launcher(tmp_path / "ours" / "bin", "dflash_tui.cli")
    other = _launcher(tmp_path / "other" / "bin", "dflash_tui.cli", python=str(tmp_path / "other" / "bin" / "python"))
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"PATH": f"{ours.parent}{os.pathsep}{other.parent}"}
    assert CliRunner().invoke(main, ["doctor"], env=env).output.splitlines()[-1] == \
        f"dflash command   {ours}: this package's"
    assert CliRunner().invoke(main, ["doctor"], env={"PATH": str(other.parent)}).output.splitlines()[-1].endswith(
        f"another installation of it (its Python: {other.parent / 'python'})")
    assert "no `dflash` on PATH" in CliRunner().invoke(main, ["doctor"], env={"PATH": str(empty)}).output


def test_dflash_tui_is_a_second_name_for_the_command():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"dflash": "dflash_tui.cli:main", "dflash-tui": "dflash_tui.cli:main"}
