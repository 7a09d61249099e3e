"""Installing: the CPU torch install falls back quickly where PyTorch's CPU index is unreachable; the sdist
carries its tests and every file once, and the wheel built from it installs one top-level import name; the
base requirements are what the package imports, the rest sits in the extra that uses it."""

from __future__ import annotations

import email
import os
import socket
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _probe_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel standing in for torch (so no large download can happen)."""
    wheel = folder / "dflashprobe-1.0-py3-none-any.whl"
    info = "dflashprobe-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("dflashprobe/__init__.py", "VERSION = '1.0'\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: dflashprobe\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def test_torch_install_falls_back_to_pips_own_configuration_when_the_cpu_index_is_unreachable(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _probe_wheel(wheels)
    dead = f"http://127.0.0.1:{_closed_port()}/simple"
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, TORCH_CPU_INDEX=dead, PIP_INDEX_URL=dead,
               PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_RETRIES="0")
    target = tmp_path / "site"
    run = subprocess.run(["sh", str(ROOT / "scripts" / "install_torch.sh"), f"{sys.executable} -m pip",
                          "dflashprobe==1.0", "--target", str(target), "--no-deps"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "could not be reached" in run.stderr  # the CPU index was tried first, then the fallback
    assert (target / "dflashprobe" / "__init__.py").is_file()


# A subset that touches every package and the fixtures (tiny models, profiles, the demo pair).
SDIST_SMOKE = ["tests/test_profiles.py", "tests/test_cli_generate.py::test_json_ids_equal_transformers_greedy",
               "tests/test_doctor.py::test_doctor_names_the_frameworks_and_what_auto_picks"]
# Import from the unpacked sdist, not from this checkout's editable install.
ISOLATED = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in repr(f)]; "
            "import pytest; sys.exit(pytest.main(sys.argv[1:]))")


def wheel_top_level(wheel: Path) -> tuple[set[str], set[str]]:
    """The names the wheel's top_level.txt declares, and the first path parts of its RECORD."""
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        declared = set(z.read(f"{info}/top_level.txt").decode().split())
        record = z.read(f"{info}/RECORD").decode().splitlines()
    return declared, {line.split(",")[0].split("/")[0] for line in record if line} - {info}


def test_the_sdist_carries_its_tests_and_they_pass_from_it_and_its_wheel_installs_one_top_level_name(tmp_path):
    import tarfile

    # sdist first, then the wheel built from it: the path a user's pip takes
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("dflash_tui-*.whl")
    assert wheel_top_level(wheel) == ({"dflash_tui"}, {"dflash_tui"})
    with zipfile.ZipFile(wheel) as z:
        assert {"dflash_tui/engines/__init__.py", "dflash_tui/engines/cuda/loop.py", "dflash_tui/profiles_data/demo.toml",
                "dflash_tui/profiles_data/demo/target/model.safetensors",
                "dflash_tui/profiles_data/demo/draft2/model.safetensors",  # both demo drafts
                "dflash_tui/py.typed",  # PEP 561: type checkers read our annotations
                "dflash_tui/tested_versions.toml"} <= set(z.namelist())  # a pip user's doctor reads it
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        assert "dflash-tui = dflash_tui.cli:main" in z.read(f"{info}/entry_points.txt").decode()
        long_description = email.message_from_bytes(z.read(f"{info}/METADATA")).get_payload()
    assert long_description.strip() == (ROOT / _pyproject()["project"]["readme"]["file"]).read_text().strip()
    (archive,) = tmp_path.glob("dflash_tui-*.tar.gz")
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        names = tar.getnames()
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / archive.name.removesuffix(".tar.gz")
    # every file once: engines/ and profiles/ at their repository paths, the package's links as links (setup.py)
    inside = {m.name.removeprefix(f"{root.name}/"): m for m in members}
    assert {name: m.linkname for name, m in inside.items() if m.issym()} == {
        "dflash_tui/engines": "../engines", "dflash_tui/profiles_data": "../profiles"}
    assert not [name for name in inside if name.startswith(("dflash_tui/engines/", "dflash_tui/profiles_data/"))]
    assert {"engines/cuda/loop.py", "profiles/demo/target/model.safetensors", "profiles/demo.toml"} <= set(inside)
    assert archive.stat().st_size < wheel.stat().st_size + 2**20  # the demo weights once (19.3 MB when twice)
    for needed in ("tests/conftest.py", "tests/tiny.py", "tests/oracles.py", "Makefile", "constraints.txt", "scripts/install_torch.sh",
                   "tests/__snapshots__/test_tui/test_snapshot_main_screen.svg", "LICENSE", ".ci/run"):
        assert f"{root.name}/{needed}" in names, needed
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    run = subprocess.run([sys.executable, "-c", ISOLATED, "-q", "-p", "no:cacheprovider", *SDIST_SMOKE],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:]
    assert " passed" in run.stdout and str(root) in subprocess.run(
        [sys.executable, "-c", "import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
         "repr(f)]; import dflash_tui; print(dflash_tui.__file__)"], cwd=root, env=env, capture_output=True,
        text=True, timeout=120).stdout


# -- dependencies: the base install is what the package imports; the rest sits in the extra that uses it --

def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    import re

    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def _imports(folder: Path) -> dict[str, set[str]]:
    """Top-level module name -> the files under `folder` that import it (absolute imports only)."""
    import ast

    found: dict[str, set[str]] = {}
    for file in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(file.relative_to(ROOT)))
    return found


MODULE = {"prompt-toolkit": "prompt_toolkit", "huggingface-hub": "huggingface_hub"}


def test_every_base_requirement_is_imported_and_the_frameworks_sit_in_their_extras():
    project = _pyproject()["project"]
    base = {_name(r) for r in project["dependencies"]}
    imported = _imports(ROOT / "dflash_tui") | _imports(ROOT / "engines")
    unused = {d for d in base if MODULE.get(d, d.replace("-", "_")) not in imported}
    assert not unused, f"base requirements nothing imports: {unused}"
    assert not base & {"numpy", "jinja2", "tokenizers", "safetensors", "starlette", "uvicorn", "torch", "transformers"}
    assert imported["safetensors"] <= {"engines/cuda/draft.py"}  # the torch engine's, so the cuda extra's
    extras = {name: {_name(r) for r in reqs} for name, reqs in project["optional-dependencies"].items()}
    assert {"safetensors", "jinja2"} <= extras["cuda"] and "jinja2" in extras["mlx"]
    assert extras["serve"] == {"starlette", "uvicorn"}
    assert all(f.startswith("dflash_tui/serve/") for f in imported["starlette"] | imported["uvicorn"])


def test_rich_is_bounded_by_what_textual_needs():
    from packaging.requirements import Requirement
    from packaging.version import Version

    ours = next(Requirement(r) for r in _pyproject()["project"]["dependencies"] if _name(r) == "rich")
    needed = next(Requirement(r) for r in metadata.requires("textual") if _name(r) == "rich")
    def floor(requirement: Requirement) -> Version:
        return max(Version(s.version) for s in requirement.specifier if s.operator == ">=")

    assert floor(ours) >= floor(needed), f"rich{ours.specifier}, but textual {metadata.version('textual')} needs {needed}"


def test_make_installs_every_extra_and_test_min_names_no_machine_path():
    makefile = (ROOT / "Makefile").read_text()
    extras = next(line for line in makefile.splitlines() if line.startswith("EXTRAS :="))
    assert set(extras.split(":=")[1].strip().split(",")) == set(_pyproject()["project"]["optional-dependencies"])
    assert "/opt/" not in makefile and "TORCH_MIN ?= torch\n" in makefile


# starlette and uvicorn refused as if the [serve] extra were not installed
WITHOUT_SERVE = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("starlette", "uvicorn"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Refuse())
from dflash_tui.cli import main
main(["serve", "--port", "0"])
"""


def test_serve_without_its_extra_is_one_sentence_naming_it(tmp_path):
    run = subprocess.run([sys.executable, "-c", WITHOUT_SERVE], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env=dict(os.environ, DFLASH_CONFIG_DIR=str(tmp_path)))
    assert run.returncode == 2, run.stderr
    assert run.stderr == ("error: `dflash serve` needs the serve extra (starlette is not installed): "
                          "pip install 'dflash-tui[serve]'\n")


def test_the_pypi_page_says_pip_install_and_links_nothing_relative():
    import re

    readme = _pyproject()["project"]["readme"]
    text = (ROOT / readme["file"]).read_text()
    assert readme["content-type"] == "text/markdown"
    assert "make " not in text and "pip install 'dflash-tui[cuda]'" in text and "dflash-tui" in text
    targets = re.findall(r"\]\(([^)]*)\)", text) + re.findall(r"<(?:img|a)[^>]+(?:src|href)=\"([^\"]+)", text)
    assert all(t.startswith(("https://", "http://", "#")) for t in targets), targets
    first = (ROOT / "README.md").read_text().split("```sh\n", 1)[1].splitlines()[:2]
    assert [line.split()[:2] for line in first] == [["make", "chat"], ["make", "test"]]  # the repository's README
