"""Bench and replay results are typed records (measure/runs.py), and files written before they were still load.

The two fixtures were written by `dflash bench --json` and `dflash replay` as they were before
`BenchResult` and `ReplayResult` existed (a random tiny pair, one turn, block sizes 1 and 4): schema /1,
one run per block size, no `repeats`. They load as one run each, and keep saying which schema they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_tui.engines import UserError
from dflash_tui.measure import bench, replay, report, runs

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BENCH_FILE = FIXTURES / "bench-before-schema-classes.json"
REPLAY_FILE = FIXTURES / "replay-before-schema-classes.json"
ONE_RUN = {"repeats": 1, "repeat_rates": []}  # what a /1 row reads as: one run, its spread unknown


def with_one_run(raw: dict) -> dict:
    """`raw` as a /1 file reads today: every row (and the framework row) one run."""
    out = json.loads(json.dumps(raw))
    for row in out["rows"] + ([out["framework"]] if out.get("framework") else []):
        row.update(ONE_RUN)
    return out


def test_a_bench_file_from_before_loads_typed_and_writes_back_the_same():
    raw = json.loads(BENCH_FILE.read_text())
    result = bench.load_result(BENCH_FILE)
    assert isinstance(result, bench.BenchResult) and result.schema == raw["schema"] == "dflash-bench/1" != bench.SCHEMA
    assert [type(r) for r in result.rows] == [bench.BenchRow, bench.BenchRow]
    assert isinstance(result.framework, bench.FrameworkRow) and result.framework.name == "transformers generate"
    assert result.rows[1].block_size == 4 and result.rows[1].identical_to_block_1 is True
    assert result.to_dict() == with_one_run(raw)  # nothing lost; only the run count added
    assert result["rows"][0]["speedup"] == result.rows[0].speedup == 1.0  # and it reads like its JSON
    assert runs.spread(result.rows[1]) is None and report.spread_cell(result.rows[1]) == "-"
    text = bench.format_result(result)
    assert "DFlash throughput" in text and "fastest: block size" in text and "best of 1 run after" in text


def test_a_replay_file_from_before_loads_typed_and_writes_back_the_same():
    raw = json.loads(REPLAY_FILE.read_text())
    result = replay.load_comparison(REPLAY_FILE)
    assert isinstance(result, replay.ReplayResult) and result.schema == raw["schema"] == "dflash-replay/1"
    assert [type(r) for r in result.rows] == [replay.ReplayRow, replay.ReplayRow]
    # written back as read, plus the draft fields files gained later, unknown (null) in a file from before them
    assert result.to_dict() == {**with_one_run(raw), "draft": None, "draft_arch": None}
    assert result["rows"] == with_one_run(raw)["rows"]
    assert result.rows[1].turns[0]["token_ids"] == raw["rows"][1]["turns"][0]["token_ids"]
    text = replay.report(result)
    assert replay.verdict(result) in text and "✓ recording" in replay.format_table(result)
    titles, cells = replay.table_rows(result)
    assert titles[replay.IDENTICAL_COLUMN] == "identical" and [c[titles.index("runs")] for c in cells] == ["1", "1"]


def test_unknown_keys_are_ignored_and_missing_ones_filled():
    raw = json.loads(BENCH_FILE.read_text())
    raw["from_the_future"] = {"x": 1}
    raw["rows"][0]["new_column"] = 3
    del raw["best_block_size"], raw["rows"][1]["peak_memory_kind"], raw["framework"]["ttft_s"]
    result = bench.BenchResult.from_dict(raw)
    assert "from_the_future" not in result.to_dict() and "new_column" not in result.rows[0]
    assert result.best_block_size == 0 and result.rows[1].peak_memory_kind == "device"
    assert result.framework.ttft_s == 0.0


def test_a_file_of_another_kind_is_one_sentence(tmp_path):
    wrong = tmp_path / "wrong.json"
    wrong.write_text(BENCH_FILE.read_text())
    with pytest.raises(UserError, match="not a dflash replay comparison"):
        replay.load_comparison(wrong)
    wrong.write_text("[1, 2]")
    with pytest.raises(UserError, match="not a dflash benchmark"):
        bench.load_result(wrong)


def test_a_row_keeps_the_fastest_of_its_runs():
    """Totals.of over three passes: the fields are the fastest pass's, every pass's rate is kept."""

    def one(tokens: int, seconds: float) -> runs.Run:
        return runs.Run(token_ids=list(range(tokens)), text="", pieces=[], acceptance_lengths=[1] * tokens,
                        generated_tokens=tokens, decode_s=seconds, decode_tokens_per_s=0.0, ttft_s=seconds / 10,
                        peak_memory_bytes=1, peak_memory_kind="device", finish_reason="stop")

    passes = [[one(11, 1.0)], [one(11, 0.5)], [one(11, 2.0)]]
    row = runs.Totals.of(4, passes)
    assert row.repeats == 3 and row.repeat_rates == [10.0, 20.0, 5.0]
    assert row.decode_tokens_per_s == 20.0 == max(row.repeat_rates) and row.ttft_s == 0.05
    assert runs.spread(row) == 15.0 and report.spread_cell(row) == "75%"
    assert report.repeats_note([row]).startswith("tok/s: best of 3 runs after a warm-up")


def test_repeats_below_one_are_one_sentence():
    with pytest.raises(UserError, match="at least 1, not 0"):
        runs.check_repeats(0)


def test_one_table_layout_for_every_result():
    lines = report.table(["block", "what", "ok"], [["1", "a", report.mark(True)], ["16", "bb", report.mark(None)]],
                         left=(1,))
    assert lines == ["block  what  ok", "-----  ----  --", "    1  a      ✓", "   16  bb     -"]
    assert report.times(None) == "-" and report.times(2.5) == "2.50x" and report.millis(0.0123) == "12.3 ms"
