"""What both training programs share in project/common besides checkpoints: one-line errors, warnings
and interrupts (console), --preset auto (presets), the estimated time and the first line (eta); and
the translation plan's parameter count against the model it describes."""

import warnings

import pytest

import minitorch
from project.common import console, eta, presets
from project.translation.model import build_model
from project.translation.options import PRESETS, parse
from project.translation.plan import parameter_count, steps_per_epoch


def test_a_usage_error_is_one_line_with_a_hint_and_status_1(capsys) -> None:
    parser = console.OneLineParser(prog="prog.py")
    parser.add_argument("--resume-from", type=int)
    for argv, expected in ((["--resume-from", "x"], "argument --resume-from: invalid int value: 'x'"),
                           (["--resume", "3"], "unrecognized arguments: --resume 3")):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            parser.parse_args(argv)
        assert info.value.code == 1
        assert capsys.readouterr().err == f"error: {expected} (--help lists every option)\n"


def test_input_errors_warnings_and_interrupts_are_one_line_each(capsys) -> None:
    def warn_then_fail() -> None:
        assert warnings.formatwarning("4 of 100 sources were truncated", UserWarning, "/x/run.py", 56) == \
            "warning: 4 of 100 sources were truncated (UserWarning, run.py:56)\n"  # fmt: skip
        raise ValueError("first line\n  second line")

    before = warnings.formatwarning
    with pytest.raises(SystemExit) as info:
        console.run_program(warn_then_fail, (ValueError,))
    assert str(info.value) == "error: first line; second line"
    assert warnings.formatwarning is before, "the program's format does not outlive it"

    def interrupted() -> None:
        raise KeyboardInterrupt("second SIGINT: stopping without saving")

    with pytest.raises(SystemExit) as info:
        console.run_program(interrupted, (ValueError,))
    assert info.value.code == console.INTERRUPTED_STATUS
    assert capsys.readouterr().err == ("interrupted (second SIGINT: stopping without saving): stopped without "
                                       "saving; the last checkpoint, if any, is as it was\n")  # fmt: skip


def test_preset_auto_follows_the_backend_and_explicit_options_win() -> None:
    assert presets.resolve_preset("auto", "cuda") == "full" and presets.resolve_preset("auto", "cpu") == "tiny"
    assert presets.resolve_preset("tiny", "cuda") == "tiny"
    on_cuda = minitorch.cuda_unavailable_reason() is None
    assert presets.resolve_preset("auto", "auto") == ("full" if on_cuda else "tiny")
    parser = presets.program_parser("a program", {"full": {}, "tiny": {"width": 8}})
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--width", type=int, default=64)
    assert presets.apply_preset(parser, {"full": {}, "tiny": {"width": 8}}, ["--backend", "cpu"]) == "tiny"
    assert parser.parse_args(["--backend", "cpu"]).width == 8 and parser.parse_args(["--width", "9"]).width == 9
    assert "auto: full where the run trains on CUDA, tiny on a CPU; full: the defaults below; tiny: --width 8" in \
        " ".join(parser.format_help().split())  # fmt: skip


def test_the_estimate_and_its_refinement() -> None:
    speed = eta.Speed(flops_per_s=1e9, step_overhead_s=0.5, startup_s=10.0)
    assert speed.train_step(1000, 100) == pytest.approx(0.5 + 6e5 / 1e9)
    plan = eta.Estimate(startup_s=10.0, step_s=1.0, steps=100, other_s=20.0)
    assert plan.total_s == 130.0
    assert plan.remaining(50, 10.0) == 60.0 and plan.remaining(50, 10.0, seconds_per_step=2.0) == 120.0
    assert [eta.format_duration(s) for s in (0.2, 81, 95, 5000, 7260)] == ["1 s", "81 s", "2 min", "83 min", "2 h 01 min"]
    pace = eta.Pace()
    assert pace.seconds_per_step is None
    pace.step()
    pace.step()
    assert pace.seconds_per_step is not None and pace.seconds_per_step >= 0.0


def test_the_first_line_says_backend_preset_size_steps_and_time() -> None:
    cpu = minitorch.choose_backend("cpu")
    line = eta.first_line(cpu, "new run in runs/mt", "tiny", True, 232_168, "80 steps (2 epochs of 40)", 81.4)
    assert line == f"{cpu}; new run in runs/mt: preset tiny (auto), 232,168 parameters, 80 steps (2 epochs of 40), " \
                   f"estimated 81 s in all"  # fmt: skip
    slow = eta.first_line(cpu, "resuming in runs/mt", "full", False, 7_296_320, "2,270 steps", 6 * 3600.0, resumed=True)
    assert slow.endswith("preset full, 7,296,320 parameters, 2,270 steps, estimated 6 h 00 min to go (--preset tiny: minutes)")


@pytest.mark.parametrize("preset", ["tiny", "full"])
def test_the_plan_counts_the_parameters_and_steps_of_the_run(preset: str) -> None:
    config = parse(["--preset", preset, "--backend", "cpu"])[0]
    model = build_model(config, config["vocab_size"], minitorch.TensorBackend(minitorch.SimpleOps))
    assert parameter_count(config, config["vocab_size"]) == sum(p.value.numel() for p in model.parameters())
    assert steps_per_epoch(config, 29000, 1) == (40 if preset == "tiny" else 227)
    assert steps_per_epoch(config, 29000, 2) == (20 if preset == "tiny" else 114)
    assert PRESETS["full"] == {} and isinstance(PRESETS["tiny"], dict)


def test_every_program_parser_is_one_line(capsys) -> None:
    from project.gpt2.options import build_parser as gpt2_parser
    from project.translation.options import build_parser as mt_parser

    for build in (gpt2_parser, mt_parser):
        parser = build()
        assert isinstance(parser, console.OneLineParser) and not parser.allow_abbrev
        with pytest.raises(SystemExit):
            parser.parse_args(["--preset", "huge"])
        assert capsys.readouterr().err.startswith("error: argument --preset: invalid choice: 'huge'")
