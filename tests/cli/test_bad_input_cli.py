"""No bad input gets through (issue 12 D): every subcommand refuses invalid options before any work.

Each case runs the CLI in-process and expects exit status 2, exactly one stderr line
``dpnoise <cmd>: error: ...`` that names the offending flag, nothing on stdout, and no work done
(no data loaded, no run started, no output file written).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from dpnoise import checks
from dpnoise.cli import audit as audit_cli
from dpnoise.cli import walls as walls_cli
from dpnoise.cli.main import build_parser, main, one_line
from dpnoise.errors import DpnoiseError
from dpnoise.training.config import OPTIONS, TEXT_MODELS, DataConfig, OutputConfig, Schedule, TrainingConfig
from dpnoise.training.privacy_plan import PrivacyOptions

from cli_refusals import (
    BAD_COUNT,
    BAD_DELTA,
    BAD_POSITIVE,
    BAD_RATE,
    assert_one_line_refusal,
    cases,
    refused_value,
    run_main,
    with_option,
)


def run_cli(capsys, argv: list[str]) -> tuple[int, str, list[str]]:
    """(exit status, stdout, stderr lines) of ``dpnoise argv``."""
    return run_main(capsys, main, argv)


def assert_refused(capsys, argv: list[str], flag: str) -> str:
    command = " ".join(argv[:2]) if argv[0] == "audit" else argv[0]
    return assert_one_line_refusal(capsys, main, argv, f"dpnoise {command}: error: ", flag)


#: values beyond what the accountants compute with: refused by the name the user gave, before anything derived
SUBNORMAL = "5e-324"
EXTREME = [SUBNORMAL, "1e-310", "1e308"]

# ----------------------------------------------------------------------------------------- train
TRAIN = ["train", "--dataset", "digits", "--model", "cnn", "--mechanism", "gaussian", "--delta", "1e-5",
         "--epochs", "1", "--batch-size", "64", "--noise", "1", "--no-progress", "--threads", "1"]


@pytest.fixture
def no_training(monkeypatch):
    """Any attempt to load data or build the model fails the test (checks must come first)."""
    import dpnoise.data
    import dpnoise.models

    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr(dpnoise.data, "load_dataset", forbidden)
    monkeypatch.setattr(dpnoise.models, "build_model", forbidden)


TRAIN_NUMERIC = [
    *cases("--clip", [*BAD_POSITIVE, *EXTREME]),
    *cases("--noise", [*BAD_POSITIVE, SUBNORMAL, "1e-310"]),  # a Gaussian sigma of 1e308 is accounted
    *cases("--epsilon", [*BAD_POSITIVE, SUBNORMAL]),
    *cases("--delta", [*BAD_DELTA, SUBNORMAL]),
    *cases("--epochs", [*BAD_POSITIVE, "1e-320"]),  # 1e-320 epochs: fewer than one step
    *cases("--batch-size", [*BAD_COUNT, "1438"]),  # digits has 1437 training examples
    *cases("--lr", BAD_POSITIVE),
    *cases("--momentum", ["-0.1", "1", "2", "nan", "inf"]),
    *cases("--weight-decay", ["-1", "nan", "inf"]),
    *cases("--label-smoothing", ["-1", "1", "2", "nan", "inf"]),
    *cases("--max-steps", BAD_COUNT),
    *cases("--limit", [*BAD_COUNT, "1438"]),
    *cases("--test-limit", [*BAD_COUNT, "361"]),
    *cases("--max-length", ["0", "1", "-1", "513"]),
    *cases("--seed", ["-1", str(2**32)]),
    *cases("--threads", BAD_COUNT),
]


@pytest.mark.parametrize("flag,value", TRAIN_NUMERIC)
def test_train_refuses_bad_numbers(capsys, tmp_path, no_training, flag, value):
    out = tmp_path / "run"
    assert_refused(capsys, with_option([*TRAIN, "--out", str(out)], flag, value), flag)
    assert not out.exists()


@pytest.mark.parametrize("path", [path for path, declared in OPTIONS.items() if declared.check])
def test_train_refuses_each_declared_check_naming_the_flag(capsys, tmp_path, no_training, path):
    """The generated parser runs each field's declared check on its flag before any work (dirichlet: every
    option applies)."""
    declared = OPTIONS[path]
    bad = refused_value(declared.check, tmp_path)
    with pytest.raises(DpnoiseError) as direct:
        getattr(checks, declared.check[0])(declared.flag, bad, *declared.check[1:])
    message = assert_refused(capsys, with_option(with_option(TRAIN, "--mechanism", "dirichlet"), declared.flag,
                                                  str(bad)), declared.flag)
    assert message == f"dpnoise train: error: {direct.value}"


def test_train_help_explains_every_declared_option(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    for declared in OPTIONS.values():
        assert declared.flag in text
        for piece in re.split(r"\{\w+\}", declared.help):  # around the registries' text
            assert "".join(piece.split()) in text, declared.flag


def test_train_options_not_given_keep_the_configuration_defaults():
    from dpnoise.cli.train import configuration_fields

    config = TrainingConfig.from_fields(configuration_fields(build_parser().parse_args(TRAIN)))
    assert config == TrainingConfig(DataConfig("digits"), PrivacyOptions(mechanism="gaussian", noise=1.0, delta=1e-5,
                                                                          epochs=1), Schedule(batch_size=64), model="cnn",
                                    output=OutputConfig(progress=False), threads=1)


def test_train_refuses_a_laplace_noise_per_clip_out_of_range_naming_both(capsys, no_training):
    lap2 = with_option(with_option(TRAIN, "--mechanism", "lap2"), "--noise", "1e10")
    assert "--noise / --clip (1e+10 / 1e-300)" in assert_refused(capsys, [*lap2, "--clip", "1e-300"], "--clip")


@pytest.mark.parametrize("value", [*BAD_POSITIVE, *EXTREME])
def test_train_refuses_bad_dirichlet_alpha(capsys, no_training, value):
    assert_refused(capsys, [*with_option(TRAIN, "--mechanism", "dirichlet"), "--alpha", value], "--alpha")


@pytest.mark.parametrize("argv,flag,message", [
    ([*TRAIN, "--alpha", "2"], "--alpha", "does not apply to mechanism 'gaussian' (only to dirichlet)"),
    ([*TRAIN, "--alpha", "nan"], "--alpha", "does not apply to mechanism 'gaussian'"),  # whether it applies, first
    ([*TRAIN, "--momentum", "0.5"], "--momentum", "applies to --optimizer sgd only"),
    ([*TRAIN, "--optimizer", "adam", "--momentum", "0.9"], "--momentum", "applies to --optimizer sgd only"),
    ([*TRAIN, "--calibrate-with", "gaussian-rdp"], "--calibrate-with", "applies only when the noise is calibrated"),
    ([*TRAIN, "--epsilon", "2", "--calibrate-with", "gaussian-rdp"], "--calibrate-with", "without --noise"),
])
def test_train_refuses_options_that_would_be_ignored(capsys, no_training, argv, flag, message):
    assert message in assert_refused(capsys, argv, flag)


@pytest.mark.parametrize("value", BAD_POSITIVE)
def test_train_refuses_bad_effective_lr(capsys, no_training, value):
    argv = [*with_option(TRAIN, "--mechanism", "dirichlet"), "--optimizer", "sgd", "--effective-lr", value]
    assert_refused(capsys, argv, "--effective-lr")


@pytest.mark.parametrize("flag,value", [("--limit", "abc"), ("--clip", "one"), ("--mechanism", "laplace"),
                                        ("--dataset", "foo"), ("--model", "vit")])
def test_train_argparse_errors_are_one_line_too(capsys, no_training, flag, value):
    assert_refused(capsys, with_option(TRAIN, flag, value), flag)


@pytest.mark.parametrize("flag,value,message", [
    ("--model", "minilm", "image dataset digits"),
    ("--model", "efficientnet-lite0-features", "RGB"),
    ("--accountant", "laplace-l1", "does not apply"),
    ("--calibrate-with", "foo", "does not apply"),
])
def test_train_refuses_inconsistent_choices(capsys, no_training, flag, value, message):
    calibrated = with_option(with_option(TRAIN, "--noise", None), "--epsilon", "2")
    assert message in assert_refused(capsys, with_option(calibrated, flag, value), flag)


def test_train_epochs_that_overflow_the_step_count(capsys, no_training):
    assert_refused(capsys, with_option(TRAIN, "--epochs", "1e308"), "--epochs")


def test_train_out_that_cannot_be_written_fails_before_training(capsys, tmp_path, no_training):
    a_file = tmp_path / "file.txt"
    a_file.write_text("not a folder")
    assert_refused(capsys, [*TRAIN, "--out", str(a_file)], "--out")
    assert_refused(capsys, [*TRAIN, "--out", str(a_file / "run")], "--out")
    assert a_file.read_text() == "not a folder"


#: a folder where nothing can be created, whatever the permission bits say (root passes os.access there)
PROC = Path("/proc")
needs_proc = pytest.mark.skipif(not (PROC / "self").is_dir(), reason="needs Linux /proc")


@needs_proc
def test_train_out_where_nothing_can_be_created_fails_before_training(capsys, no_training):
    for out in (PROC / "dpnoise-run", PROC / "self" / "dpnoise-run"):
        assert_refused(capsys, [*TRAIN, "--out", str(out)], "--out")


@pytest.mark.skipif(getattr(os, "geteuid", lambda: 0)() == 0, reason="root may write anywhere")
def test_train_out_in_a_read_only_folder(capsys, tmp_path, no_training):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert_refused(capsys, [*TRAIN, "--out", str(locked / "run")], "--out")
    finally:
        locked.chmod(0o700)


def test_train_resume_file_must_be_a_checkpoint(capsys, tmp_path, no_training):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    text = tmp_path / "notes.txt"
    text.write_text("this is not a checkpoint\n")
    for path, message in [(tmp_path / "missing.pt", "does not exist"), (empty, "is empty"),
                          (text, "not a dpnoise checkpoint"), (tmp_path, "not a file")]:
        assert message in assert_refused(capsys, [*TRAIN, "--resume", str(path)], "--resume")


def test_train_data_root_must_exist(capsys, tmp_path, no_training):
    assert_refused(capsys, [*TRAIN, "--data-root", str(tmp_path / "nowhere")], "--data-root")


def test_train_damaged_checkpoint_is_a_clean_error(capsys, tmp_path):
    """A zip that is not a checkpoint gets past the up-front check; load_checkpoint refuses it (exit 2)."""
    import zipfile

    fake = tmp_path / "fake.pt"
    with zipfile.ZipFile(fake, "w") as archive:
        archive.writestr("data.txt", "hello")
    message = assert_refused(capsys, [*TRAIN, "--max-steps", "1", "--resume", str(fake)], "--resume")
    assert str(fake) in message


def test_train_resume_under_another_setup_is_a_clean_error(capsys, tmp_path):
    small = [*TRAIN, "--limit", "128", "--test-limit", "50", "--max-steps", "1", "--json"]
    assert main([*small, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    message = assert_refused(capsys, [*with_option(small, "--noise", "2"), "--resume", str(checkpoint)], "--resume")
    assert "noise" in message


# ----------------------------------------------------------------------------------------- audit
BOUND = ["audit", "bound", "--mechanism", "gaussian", "--noise", "1", "--sample-rate", "0.1", "--steps", "10",
         "--grid", "4096"]
SAMPLER = ["audit", "sampler", "--mechanism", "gaussian", "--noise", "1", "--trials", "100"]
TRAINING = ["audit", "training", "--steps", "2", "--canaries", "20", "--guesses", "10"]
LEAKAGE = ["audit", "dirichlet-leakage", "--trials", "4"]
STATISTICAL = [*cases("--delta", BAD_DELTA), *cases("--confidence", ["0", "1", "1.5", "-0.5", "nan"]),
               *cases("--seed", ["-1", str(2**32)])]


@pytest.fixture
def no_audit(monkeypatch):
    """The audits themselves fail the test: every refusal must come from the up-front checks."""
    import dpnoise.audit.bound
    import dpnoise.audit.sampler
    import dpnoise.audit.training

    def forbidden(*args, **kwargs):
        raise AssertionError("the audit ran before its options were checked")

    for module, name in [(dpnoise.audit.bound, "audit_bound"), (dpnoise.audit.sampler, "audit_sampler"),
                         (dpnoise.audit.training, "audit_one_run"),
                         (dpnoise.audit.training, "audit_dirichlet_leakage")]:
        monkeypatch.setattr(module, name, forbidden)


@pytest.mark.parametrize("flag,value", [
    *cases("--noise", BAD_POSITIVE),
    *cases("--clip", BAD_POSITIVE),
    *cases("--sample-rate", BAD_RATE),
    *cases("--steps", BAD_COUNT),
    *cases("--alpha", BAD_POSITIVE),
    *cases("--grid", ["1", "0", "-5", "63", str(1 << 30)]),
    *cases("--loss-step", BAD_POSITIVE),
    *cases("--delta", BAD_DELTA),
    *cases("--params", [*BAD_COUNT, str(10**13)]),  # up to 1e12
    *cases("--k", ["0", "-3", "a,b", "1,,2", "101"]),
    *cases("--mechanism", ["foo"]),
])
def test_audit_bound_refuses(capsys, no_audit, flag, value):
    argv = with_option([*BOUND, "--params", "100"], flag, value)
    assert_refused(capsys, argv, flag)


def test_audit_bound_lap2_needs_params(capsys, no_audit):
    assert_refused(capsys, with_option(BOUND, "--mechanism", "lap2"), "--params")


def test_audit_bound_loss_grid_too_fine_is_a_clean_error(capsys):
    """Too many steps for the loss grid: refused with one line (was a 3.7 TiB MemoryError)."""
    message = assert_refused(capsys, with_option(BOUND, "--steps", "1000000000"), "loss step")
    assert "grid cells" in message


@pytest.mark.parametrize("flag,value", [
    *cases("--noise", BAD_POSITIVE),
    *cases("--clip", BAD_POSITIVE),
    *cases("--dim", BAD_COUNT),
    *cases("--trials", [*BAD_COUNT, "1"]),
    *STATISTICAL,
    *cases("--mechanism", ["dirichlet"]),
])
def test_audit_sampler_refuses(capsys, no_audit, flag, value):
    assert_refused(capsys, with_option(SAMPLER, flag, value), flag)


def test_audit_sampler_refuses_more_draws_than_memory(capsys, no_audit):
    assert_refused(capsys, [*with_option(SAMPLER, "--trials", "100000000"), "--dim", "16"], "--trials")


@pytest.mark.parametrize("flag,value", [
    *cases("--noise", BAD_POSITIVE),
    *cases("--clip", BAD_POSITIVE),
    *cases("--sample-rate", BAD_RATE),
    *cases("--steps", BAD_COUNT),
    *cases("--canaries", [*BAD_COUNT, "1", "100000"]),
    *cases("--guesses", [*BAD_COUNT, "3", "22"]),  # odd, or more than --canaries 20
    *STATISTICAL,
])
def test_audit_training_refuses(capsys, no_audit, flag, value):
    assert_refused(capsys, with_option(TRAINING, flag, value), flag)


@pytest.mark.parametrize("flag,value", [
    *cases("--noise", BAD_POSITIVE),
    *cases("--alpha", BAD_POSITIVE),
    *cases("--batch", [*BAD_COUNT, "32"]),  # not < --features 32
    *cases("--features", ["0", "1", "-2"]),
    *cases("--trials", [*BAD_COUNT, "1"]),
    *STATISTICAL,
])
def test_audit_dirichlet_leakage_refuses(capsys, no_audit, flag, value):
    assert_refused(capsys, with_option(LEAKAGE, flag, value), flag)


def test_audit_without_kind_is_one_line(capsys):
    code, _, err = run_cli(capsys, ["audit"])
    assert code == 2 and len(err) == 1 and err[0].startswith("dpnoise audit: error: ")


# ----------------------------------------------------------------------------------------- walls
@pytest.mark.parametrize("flag,value", [
    *cases("--sample-rates", BAD_RATE),
    *cases("--epochs", [*BAD_POSITIVE, "1e-320"]),
    *cases("--params", ["0", "-1", "0.5", "nan", "inf", "1e13"]),
    *cases("--delta", BAD_DELTA),
    *cases("--fixed-noise", BAD_POSITIVE),
])
def test_walls_refuses_bad_numbers(capsys, tmp_path, flag, value):
    out = tmp_path / "walls.png"
    assert_refused(capsys, ["walls", "--out", str(out), flag, value], flag)
    assert not out.exists()


def test_walls_epochs_that_overflow_the_step_count(capsys, tmp_path):
    assert_refused(capsys, ["walls", "--out", str(tmp_path / "w.png"), "--sample-rates", "1e-308"], "--sample-rates")
    assert_refused(capsys, ["walls", "--out", str(tmp_path / "w.png"), "--epochs", "1e308"], "--epochs")
    assert list(tmp_path.iterdir()) == []


@needs_proc
def test_walls_out_where_nothing_can_be_created(capsys):
    assert_refused(capsys, ["walls", "--out", str(PROC / "dpnoise-walls.png")], "--out")


def test_walls_out_must_be_a_png_in_an_existing_folder(capsys, tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for out, message in [(tmp_path, "must be a .png file"), (tmp_path / "walls", "must be a .png file"),
                         (tmp_path / "missing" / "walls.png", "does not exist"),
                         (a_file / "walls.png", "not a folder"), (tmp_path / "dir.png", "is a folder")]:
        if out.name == "dir.png":
            out.mkdir()
        assert message in assert_refused(capsys, ["walls", "--out", str(out)], "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.png", "file.txt"]


# --------------------------------------------------------------------------- account, calibrate
ACCOUNT = ["account", "--mechanism", "gaussian", "--noise", "1", "--sample-rate", "0.01", "--steps", "100",
           "--delta", "1e-5"]


@pytest.mark.parametrize("argv,flag", [
    (with_option(ACCOUNT, "--sample-rate", "0"), "--sample-rate"),
    (with_option(ACCOUNT, "--steps", "0"), "--steps"),
    (with_option(ACCOUNT, "--mechanism", "foo"), "--mechanism"),
    (["calibrate", *with_option(ACCOUNT[1:], "--noise", None), "--epsilon", "inf"], "--epsilon"),
    (["calibrate", *with_option(ACCOUNT[1:], "--noise", None), "--epsilon", "0"], "--epsilon"),
    (with_option(with_option(ACCOUNT, "--steps", None), "--epochs", "1e-320"), "--epochs"),  # no step
    (with_option(with_option(ACCOUNT, "--steps", None), "--epochs", "1e308"), "--epochs"),
    ([*with_option(ACCOUNT, "--mechanism", "lap2"), "--params", "1e13"], "--params"),  # up to 1e12
    ([*with_option(ACCOUNT, "--mechanism", "lap2"), "--params", "0.5"], "--params"),
    ([*with_option(ACCOUNT, "--mechanism", "dirichlet"), "--classes", "1"], "--classes"),
    ([*with_option(ACCOUNT, "--mechanism", "dirichlet"), "--classes", "2.5"], "--classes"),
    ([*with_option(ACCOUNT, "--mechanism", "dirichlet"), "--classes", "-2"], "--classes"),
])
def test_accounting_commands_refuse(capsys, argv, flag):
    assert_refused(capsys, argv, flag)


CALIBRATE = ["calibrate", *with_option(ACCOUNT[1:], "--noise", None), "--epsilon", "1"]
#: (a command line, its numeric options), each option tried at extreme values
EXTREME_SETTINGS = [
    (ACCOUNT, ["--noise", "--clip", "--sample-rate", "--steps", "--delta"]),
    ([*with_option(ACCOUNT, "--mechanism", "lap2"), "--params", "1000"], ["--noise", "--clip", "--params"]),
    (with_option(ACCOUNT, "--mechanism", "laplace-l1"), ["--noise", "--clip"]),
    (with_option(with_option(ACCOUNT, "--mechanism", "dirichlet"), "--noise", "0.5"), ["--noise", "--alpha"]),
    (CALIBRATE, ["--epsilon", "--delta"]),
    ([*with_option(CALIBRATE, "--mechanism", "lap2"), "--params", "1000"], ["--clip"]),
]


@pytest.mark.parametrize("argv,flag,value", [
    pytest.param(argv, flag, value, id=f"{argv[0]} {argv[2]} {flag}={value}")
    for argv, flags in EXTREME_SETTINGS for flag in flags for value in [*EXTREME, "inf", "nan", "0", "-1"]])
def test_extreme_values_are_refused_by_the_name_given_or_accounted_without_warnings(capsys, argv, flag, value):
    """A subnormal, huge, infinite, NaN, zero or negative value: one line naming the option given (not a
    parameter derived from it, such as the noise multiplier b / C), and no numpy warning first."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        code, out, err = run_cli(capsys, with_option(argv, flag, value))
    if code == 2:
        assert len(err) == 1 and flag in err[0], err
    else:
        assert (code, err) == (0, []) and "epsilon" in out


@pytest.mark.parametrize("command", ["account", "calibrate"])
@pytest.mark.parametrize("flag,value,mechanism", [
    ("--alpha", "nan", "gaussian"), ("--alpha", "2", "lap2"), ("--alpha", "1", "laplace-l1"),
    ("--params", "-5", "gaussian"), ("--params", "100", "dirichlet"), ("--params", "100", "laplace-l1"),
    ("--classes", "2", "gaussian"), ("--classes", "2", "penultimate-gaussian"), ("--classes", "10", "lap2"),
])
def test_accounting_commands_refuse_options_the_mechanism_does_not_take(capsys, command, flag, value, mechanism):
    argv = [*with_option(ACCOUNT, "--mechanism", mechanism), flag, value]
    if command == "calibrate":
        argv = ["calibrate", *with_option(argv[1:], "--noise", None), "--epsilon", "1"]
    if mechanism == "lap2":
        argv += ["--params", "100"]
    assert "does not apply to mechanism" in assert_refused(capsys, argv, flag)


# ------------------------------------------------------------------------------- error handling
def test_only_dpnoise_errors_become_exit_2(monkeypatch, tmp_path, capsys):
    """A DpnoiseError is one line and status 2; any other exception is a bug and propagates."""

    def raises(error):
        def run(args):
            raise error
        return run

    out = str(tmp_path / "w.png")
    monkeypatch.setattr(walls_cli, "run", raises(DpnoiseError("first line\n  second line")))
    assert main(["walls", "--out", out]) == 2
    assert capsys.readouterr().err == "dpnoise walls: error: first line; second line\n"
    for bug in (ValueError("a plain ValueError is a bug"), ZeroDivisionError("boom")):
        monkeypatch.setattr(walls_cli, "run", raises(bug))
        with pytest.raises(type(bug)):
            main(["walls", "--out", out])


def test_a_lost_process_group_ends_the_process_with_status_2_after_its_line():
    """No interpreter shutdown (here: an atexit handler) runs after the line, so the broken group's threads
    cannot abort the exit; what was printed before is flushed."""
    script = (
        "import atexit, sys\n"
        "from dpnoise.cli import walls, main\n"
        "from dpnoise.errors import ProcessGroupLostError\n"
        "atexit.register(lambda: print('shutdown ran', file=sys.stderr))\n"
        "def lost(args):\n"
        "    print('before', end='')\n"
        "    raise ProcessGroupLostError('rank 0 of 2: summing failed')\n"
        "walls.run = lost\n"
        "sys.exit(main.main(['walls', '--out', 'unused.png']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, "before"), done.stderr
    assert done.stderr == "dpnoise walls: error: rank 0 of 2: summing failed\n"


def test_one_line_messages():
    assert one_line("unsupported layers for private training:\n  a (BatchNorm1d): x\n  b (LSTM): y") == \
        "unsupported layers for private training: a (BatchNorm1d): x; b (LSTM): y"
    assert one_line("plain") == "plain"


# --------------------------------------------------------------------------------- lazy imports
#: (the package dpnoise.training loads its names on first use, and its configuration and recipes import no torch:
#: the train command's parser is built from the configuration's fields)
HEAVY = ("torch", "opacus", "matplotlib", "dpnoise.training.engine", "dpnoise.training.pipeline", "dpnoise.data",
         "dpnoise.models", "dpnoise.mechanisms")


def heavy_modules_imported_by(code: str) -> str:
    """The HEAVY modules a fresh interpreter has imported after running ``code``."""
    script = f"import sys\n{code}print([m for m in {HEAVY!r} if m in sys.modules])\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()


def test_building_the_parser_imports_no_torch_opacus_or_matplotlib():
    assert heavy_modules_imported_by("from dpnoise.cli.main import build_parser\nbuild_parser()\n") == "[]"


def test_refusing_bad_input_imports_no_torch():
    code = ("from dpnoise.cli.main import main\n"
            "assert main(['walls', '--out', 'x.png', '--delta', '2']) == 2\n"
            "assert main(['audit', 'bound', '--mechanism', 'gaussian', '--noise', '0', '--sample-rate', '0.1',"
            " '--steps', '1']) == 2\n"
            "assert main(['train', '--dataset', 'digits', '--mechanism', 'lap2', '--delta', '1e-5', '--epochs',"
            " '1', '--batch-size', '64', '--noise', 'nan']) == 2\n")
    assert heavy_modules_imported_by(code) == "[]"


def test_light_choice_lists_match_the_registries():
    from dpnoise.data import DATASETS
    from dpnoise.mechanisms import RUNNABLE_MECHANISMS
    from dpnoise.models import MODELS, TRAINABLE_PARTS

    assert OPTIONS["data.name"].choices == tuple(sorted(name for name in DATASETS if ":" not in name))  # packaged
    assert OPTIONS["model"].choices == tuple(MODELS)
    assert OPTIONS["privacy.mechanism"].allowed() == tuple(sorted(RUNNABLE_MECHANISMS))
    assert OPTIONS["trainable"].choices == TRAINABLE_PARTS
    for path, declared in OPTIONS.items():  # every registry a field names holds its choices
        if declared.registry is not None:
            module, _, name = declared.registry.rpartition(".")
            registered = set(getattr(importlib.import_module(module), name))
            assert set(declared.allowed()) == {key for key in registered if ":" not in key}, path  # own data aside
    assert set(TEXT_MODELS) <= set(MODELS)
    assert audit_cli.GRADIENT_MECHANISMS == [m for m in sorted(RUNNABLE_MECHANISMS)
                                             if RUNNABLE_MECHANISMS[m].needs_per_sample_gradients]
