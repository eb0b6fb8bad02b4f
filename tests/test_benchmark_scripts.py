"""Every benchmark script imports what it uses and parses its options: `--help` exits 0 from any
working directory (the benchmarks themselves run on the GPU machine, where a broken import would
cost a device call); benchmarks/common.py's table, timer and JSON + PNG writer work on the CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.name != "common.py")
OUT_IS_A_FILE = {"gpt2_torch_peer", "profile_kernels"}  # --out names a JSON file, not a results folder
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import RESULTS, Column, Panel, Table, out_option, wall_clock, write_results  # noqa: E402


@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.name for p in BENCHMARKS])
def test_help_runs(script: Path, tmp_path: Path) -> None:
    """--help works from another folder; a script with a results folder names it (its --out default)."""
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
    if script.stem not in OUT_IS_A_FILE:
        assert f"benchmarks/results/{script.stem}" in done.stdout


def test_results_hold_one_folder_per_script_and_the_runs() -> None:
    scripts = {p.stem for p in BENCHMARKS}
    folders = {p.name for p in RESULTS.iterdir() if p.is_dir()}
    assert folders <= scripts | {"runs"}, f"results folders without a script: {sorted(folders - scripts - {'runs'})}"
    assert not [p.name for p in RESULTS.iterdir() if p.is_file()], "results files belong in a script's folder or runs/"


def test_out_option_defaults_to_the_results_folder() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    out_option(parser, "bench_x")
    assert parser.parse_args([]).out == RESULTS / "bench_x"
    assert parser.parse_args(["--out", "elsewhere"]).out == Path("elsewhere")


def test_table_formats_numbers_strings_and_missing_cells(capsys) -> None:
    table = Table(Column("name", 6, "name", left=True), Column("ms", 7, "ms", ".2f"),
                  Column("ratio", 6, lambda r: r.get("ratio"), ".1f", "x"))  # fmt: skip
    table.header()
    table.row({"name": "fused", "ms": 1.234, "ratio": 2.0})
    table.row({"name": "naive", "ms": None})
    table.row({"name": "big"}, first=1, note="skipped: too big")
    assert capsys.readouterr().out.splitlines() == [
        "name        ms  ratio",
        "fused     1.23   2.0x",
        "naive        -      -",
        "big    skipped: too big",
    ]


def test_wall_clock_times_each_call_and_keeps_every_result() -> None:
    calls = iter(range(10))
    synced = []
    clock = wall_clock(lambda: next(calls), reps=3, warmup=2, sync=lambda: synced.append(1))
    assert clock.results == [0, 1, 2, 3, 4]
    assert len(clock.seconds) == 3 and all(s >= 0 for s in clock.seconds)
    assert len(synced) == 6 and clock.median == sorted(clock.seconds)[1]


def test_write_results_writes_json_and_a_png_of_every_panel_kind(tmp_path: Path, capsys) -> None:
    report = {"rows": [{"name": "a", "ms": 1.5}], "device": "cpu"}
    panels = [
        Panel(["a", "b"], {"ours": [1.0, None], "theirs": [2.0, 3.0]}, log=True, ref=1.5, ref_label="copy"),
        Panel(["a", "b"], {"ms": [1.0, 2.0]}, kind="barh", notes=["1 ms", "2 ms"], colors=["tab:blue"]),
        Panel(["a", "b"], {"kernels": [1.0, 2.0], "host": [0.5, 0.5]}, kind="stacked", rotation=30),
        Panel([1, 2, 4], {"cap": [1.0, 0.9, None]}, kind="lines", x_log_base=2, xlabel="processes"),
    ]
    write_results(tmp_path / "out", "bench_x", report, panels, title="test", columns=2)
    assert json.loads((tmp_path / "out" / "bench_x.json").read_text()) == report
    assert (tmp_path / "out" / "bench_x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "out").glob("*.tmp"))
    assert "wrote" in capsys.readouterr().out
    write_results(tmp_path / "json_only", "bench_y", report)
    assert [p.name for p in (tmp_path / "json_only").iterdir()] == ["bench_y.json"]


def test_profile_kernels_runs_a_program_and_names_a_missing_one(tmp_path: Path) -> None:
    """The program runs as __main__ with its own arguments; on a machine without a GPU the table is
    empty. No program, or a missing file, is a usage error."""
    program = tmp_path / "program.py"
    program.write_text("import sys\nif __name__ == '__main__':\n    print('ran with', sys.argv[1:])\n")
    out = tmp_path / "kernels.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "profile_kernels.py"), "--out", str(out), "--", str(program), "x"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ran with ['x']" in done.stdout and "kernels," in done.stdout
    assert out.exists()
    for tail in ([], ["--", str(tmp_path / "missing.py")]):
        done = subprocess.run(cmd[:2] + tail, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and ("give the program" in done.stderr or "missing.py" in done.stderr)


def test_idle_gaps_merge_overlapping_kernels_and_split_launch_gaps_from_pauses() -> None:
    """profile_kernels.idle_gaps: the union of the device intervals (overlapping kernels of two
    streams count once) and the gaps inside it, those under short_us counted as launch gaps."""
    from profile_kernels import idle_gaps

    spans = [(0, 10), (5, 12), (14, 20), (100, 110), (111, 112), (3, 4)]
    gaps = idle_gaps(_profile(spans), short_us=50)
    assert gaps["busy_ms"] * 1e3 == pytest.approx(12 + 6 + 10 + 1)
    assert gaps["short_gaps"] == 2 and gaps["short_gap_ms"] * 1e3 == pytest.approx(3)  # 12 -> 14, 110 -> 111
    assert gaps["median_short_gap_us"] == 2


def test_kernel_rows_charge_each_kernel_with_what_it_adds_to_the_busy_span() -> None:
    """A kernel inside another's span adds nothing, one that outlasts it adds its tail; the column sums
    to the busy time while the kernels' own times count the overlap twice."""
    from profile_kernels import kernel_rows

    spans = [(0, 10, "a"), (5, 12, "b"), (3, 4, "c"), (14, 20, "a"), (18, 30, "b")]
    rows = {r["kernel"]: r for r in kernel_rows(_profile(spans))}
    assert {k: r["adds_us"] for k, r in rows.items()} == {"a": 16.0, "b": 12.0, "c": 0.0}  # b: 10 -> 12, 20 -> 30
    assert rows["a"]["total_us"] == 16 and rows["b"]["total_us"] == 19 and rows["b"]["launches"] == 2
    assert rows["b"]["mean_us"] == 9.5


def _profile(spans):
    """A stand-in for torch.profiler's profile: device events (start, end[, name]) and one host event."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    events = [SimpleNamespace(device_type=DeviceType.CUDA, device_time=s[1] - s[0], name=s[2] if len(s) > 2 else "k",
                              time_range=SimpleNamespace(start=s[0], end=s[1])) for s in spans]  # fmt: skip
    events.append(SimpleNamespace(device_type=DeviceType.CPU, device_time=0, time_range=None, name="host"))
    return SimpleNamespace(events=lambda: events)


def test_panel_names_a_bad_kind_and_a_series_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match=r"Panel kind 'pie' is none of"):
        Panel(["a"], {"ms": [1.0]}, kind="pie")
    with pytest.raises(ValueError, match=r"series 'ms' has 1 values for 2 x entries"):
        Panel(["a", "b"], {"ms": [1.0]})


def test_power_samples_drop_the_loop_edges_and_skip_cut_lines() -> None:
    """bench_matmul_power.py: nvidia-smi's lines as numbers without the loop's first 4 and last 2 samples
    or a line cut off by the stop; medians and extremes of what is left, and a clear error for none."""
    from bench_matmul_power import parse_samples, summarize

    clocks = [1980, 1700, 1600, 1550, 1500, 1515, 1485, 1530, 1500, 1200]
    lines = [f"{c}, {680 + i}.5, {50 + i}" for i, c in enumerate(clocks)] + ["1500, 69", "[N/A], 1, 2"]
    samples = parse_samples("\n".join(lines) + "\n")
    assert [s[0] for s in samples] == [1500, 1515, 1485, 1530]
    row = summarize("ours bf16", 211.5, samples)
    assert row["clock_mhz"] == 1507.5 and row["clock_min"] == 1485 and row["power_w"] == 686.0
    assert row["temp_c"] == 57 and row["samples"] == 4 and row["us"] == 211.5
    with pytest.raises(RuntimeError, match="ours bf16: nvidia-smi gave no samples"):
        summarize("ours bf16", 1.0, parse_samples("1500, 690, 50\n"))
