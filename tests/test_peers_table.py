"""benchmarks/peers.py's table code on made-up rows (`make peers` installs and runs the peers, which no test
does): the ratios, the ids check, the one line for a peer that could not run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def peers_module():
    spec = importlib.util.spec_from_file_location("peers_benchmark", ROOT / "benchmarks" / "peers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_table_gives_speedups_ratios_to_dflash_and_marks_differing_ids():
    peers = peers_module()
    Mode, Row = peers.Mode, peers.Row
    same = [[1, 2, 3], [4, 5]]
    rows = [
        Row("dflash", "demo", 1, Mode([(100, 1.0), (100, 0.5)], same, None, 2.0), Mode([(100, 0.125)], same, 12.5, 4.0)),
        Row("z-lab", "demo", 1, Mode([(100, 0.4)], same), Mode([(100, 0.1)], [[1, 2, 3], [4, 6]], 12.0)),
        Row("dflash", "demo", 2, Mode([(100, 0.25)], same), Mode([(100, 0.05)], same, 12.5)),
        Row("dflash compiled", "demo", 2, Mode([(100, 0.2)], same), Mode([(100, 0.04)], same, 12.5)),
        Row("vLLM", "demo", 2, Mode([(100, 0.5)], same), Mode([(100, 0.1)], same)),
        Row("llama.cpp", error="cmake failed: no compiler"),
    ]
    peers.check_ids(rows, {"demo": same})
    lines = peers.table(rows, "title").splitlines()
    assert lines[0] == "title"
    body = {(cells[2], cells[3]): cells for cells in ([c.strip() for c in line.split("|")] for line in lines[4:])}
    dflash1 = body[("dflash", "1")]
    assert dflash1[4:12] == ["200.0", "800.0", "4.00x", "12.50", "1.00x", "2.00", "4.00", "same"]
    zlab = body[("z-lab", "1")]
    assert zlab[5:9] == ["1000.0", "4.00x", "12.00", "1.25x"]  # vs dflash at the same threads: 1000 / 800
    assert zlab[11] == "**DIFFER** on 1/2 prompts"
    vllm = body[("vLLM", "2")]
    assert vllm[6:9] == ["5.00x", "-", "0.40x"]  # no tau reported; 1000 against dflash's fastest, 2500 (compiled)
    assert body[("dflash", "2")][8] == "0.80x"  # dflash's rows too are measured against its fastest
    failed = [line for line in lines if "llama.cpp" in line]
    assert failed == ["| - | llama.cpp | - | could not run: cmake failed: no compiler |||||||"]
    assert len(lines) == 4 + len(rows)


def test_ids_are_compared_without_the_stop_id_and_a_missing_prompt_differs():
    peers = peers_module()
    assert peers.strip_stops([5, 6, 770, 9], [770, 768]) == ([5, 6], True)
    assert peers.strip_stops([5, 6], [770]) == ([5, 6], False)
    row = peers.Row("vLLM", "big", 1, peers.Mode([(1, 1.0)], [[1]]), None)
    peers.check_ids([row], {"big": [[1], [2]]})
    assert (row.differ, row.prompts) == (1, 2)
