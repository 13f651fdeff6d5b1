"""``dpnoise account`` / ``calibrate`` / ``walls`` (and the printed bounds of ``audit bound``) through the real
entry point."""

import json
import re
import subprocess
import sys

import pytest

from dpnoise.accounting import UnsoundAccountantWarning
from dpnoise.cli.main import main

from cli_refusals import with_option

SEED = ["--sample-rate", "0.0043", "--steps", "5860", "--params", "26010", "--delta", "1e-5"]


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_account_lap2_json_has_both_accountants(capsys):
    out = run_json(capsys, ["account", "--mechanism", "lap2", "--noise", "0.799", *SEED])
    for key in ("mechanism", "epsilon", "delta", "bound", "steps", "sample_rate", "sound", "epsilon_by_accountant"):
        assert key in out
    assert out["sound"] is True and out["steps"] == 5860
    assert out["epsilon_by_accountant"]["lap2-paper"] == pytest.approx(3.42, abs=0.005)
    assert out["epsilon"] == out["epsilon_by_accountant"]["lap2"]


def test_account_lap2_paper_is_flagged_unsound(capsys):
    with pytest.warns(UnsoundAccountantWarning, match="NOT a valid privacy bound"):
        out = run_json(capsys, ["account", "--mechanism", "lap2-paper", "--noise", "0.4", *SEED])
    assert out["sound"] is False and out["epsilon"] == pytest.approx(7.94, abs=0.005)
    assert "NOT a valid privacy bound" in out["warning"]


def test_account_batch_size_and_epochs(capsys):
    out = run_json(capsys, ["account", "--mechanism", "dirichlet", "--noise", "0.08", "--batch-size", "256",
                            "--dataset-size", "50000", "--epochs", "30", "--delta", "1e-5"])
    assert out["steps"] == 5860 and out["sample_rate"] == pytest.approx(256 / 50000)
    assert out["epsilon"] < 4 and "NOT a guarantee for the trained model" in out["scope"]


@pytest.mark.parametrize("r,alpha", [(0.5, None), (2.0, None), (2.0, 1.0), (10.0, 1.0), (0.5, 0.3)])
def test_account_and_training_agree_on_a_dirichlet_r_at_or_above_alpha(capsys, r, alpha):
    """The same alpha default and the same validity rule: r >= alpha is accounted at the real orders below
    1 + alpha / r (a finite epsilon at r = 2, alpha = 1), and no admissible order gives an infinite one."""
    from dpnoise.accounting import epsilon_of_events
    from dpnoise.training.privacy_plan import PrivacyOptions, resolve

    argv = ["account", "--mechanism", "dirichlet", "--noise", str(r), "--sample-rate", "0.0445", "--steps", "23",
            "--delta", "1e-5", *([] if alpha is None else ["--alpha", str(alpha)])]
    printed = run_json(capsys, argv)["epsilon"]
    plan = resolve(PrivacyOptions(mechanism="dirichlet", noise=r, options={"alpha": alpha}, delta=1e-5), sample_rate=0.0445,
                   params=100)
    trained = epsilon_of_events(plan.setup.accountant, plan.step_event, steps=23, delta=1e-5)
    assert (printed is None) == (trained == float("inf"))
    assert printed is None or printed == pytest.approx(trained)
    assert (printed is not None) == (r < 10.0 and (alpha or 1.0) >= 0.5)


def test_calibrate_lap2_and_dirichlet(capsys):
    lap2 = run_json(capsys, ["calibrate", "--mechanism", "lap2", "--epsilon", "1", "--clip", "0.5", *SEED])
    assert lap2["clip"] == 0.5 and lap2["epsilon"] <= 1 and set(lap2["epsilon_by_accountant"]) == {"lap2", "lap2-rdp", "lap2-gdp", "lap2-paper"}
    dirichlet = run_json(capsys, ["calibrate", "--mechanism", "dirichlet", "--epsilon", "4", "--batch-size", "256",
                                  "--dataset-size", "50000", "--epochs", "30", "--delta", "1e-5"])
    assert dirichlet["epsilon"] <= 4  # replace-one, exact two-vertex base RDP (default)
    with pytest.warns(UnsoundAccountantWarning, match="NOT a valid bound under replace-one"):
        ponnoprat = run_json(capsys, ["calibrate", "--mechanism", "dirichlet", "--accountant", "dirichlet-ponnoprat",
                                      "--epsilon", "4", "--batch-size", "256", "--dataset-size", "50000", "--epochs",
                                      "30", "--delta", "1e-5"])
    assert ponnoprat["noise"] == pytest.approx(0.248, abs=6e-4)  # the paper's accountant
    assert dirichlet["noise"] < ponnoprat["noise"] / 3  # what its add/remove reading under-counts


def test_two_classes_give_the_dirichlet_pld_route(capsys):
    """--classes 2: the default answers by its two-class PLD route, below its other routes, and r* grows."""
    setting = ["--mechanism", "dirichlet", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5"]
    two = run_json(capsys, ["account", *setting, "--noise", "0.1", "--classes", "2"])
    plain = run_json(capsys, ["account", *setting, "--noise", "0.1"])
    assert two["bound"].startswith("dirichlet-pld: PLD") and two["num_classes"] == 2
    assert two["epsilon"] < plain["epsilon"] == min(plain["epsilon_by_accountant"]["dirichlet-release-count"],
                                                    plain["epsilon_by_accountant"]["dirichlet-rdp"])
    assert "dirichlet-pld" not in plain["bound"] and plain["num_classes"] is None  # the route does not apply
    assert main(["account", *setting, "--noise", "0.1", "--classes", "2"]) == 0
    assert "accountant dirichlet: epsilon" in capsys.readouterr().out.splitlines()[0]
    one_step = ["calibrate", "--mechanism", "dirichlet", "--sample-rate", "1", "--steps", "1", "--delta", "1e-5",
                "--epsilon", "4"]
    calibrated = run_json(capsys, [*one_step, "--classes", "2"])
    assert calibrated["num_classes"] == 2 and calibrated["epsilon"] <= 4
    assert calibrated["noise"] > run_json(capsys, one_step)["noise"]


#: (calibrate options, target epsilon): small settings (the RDP accountant where the default is slow), and
#: the README's Dirichlet command
PRINTED_CALIBRATIONS = [
    pytest.param(["--mechanism", "gaussian", "--accountant", "gaussian-rdp", "--sample-rate", "0.05", "--steps",
                  "200"], 4.0, id="gaussian-rdp"),
    pytest.param(["--mechanism", "gaussian", "--sample-rate", "0.1", "--steps", "10"], 2.0, id="gaussian"),
    pytest.param(["--mechanism", "lap2", "--accountant", "lap2-rdp", "--params", "1000", "--clip", "0.7",
                  "--sample-rate", "0.1", "--steps", "10"], 2.0, id="lap2-rdp"),
    pytest.param(["--mechanism", "laplace-l1", "--clip", "0.3", "--sample-rate", "0.1", "--steps", "10"], 2.0,
                 id="laplace-l1"),
    pytest.param(["--mechanism", "dirichlet", "--sample-rate", "0.05", "--steps", "200"], 4.0, id="dirichlet"),
    pytest.param(["--mechanism", "dirichlet", "--alpha", "1", "--batch-size", "256", "--dataset-size", "50000",
                  "--epochs", "30"], 4.0, id="dirichlet-readme"),
]


@pytest.mark.parametrize("setting,target", PRINTED_CALIBRATIONS)
def test_printed_calibration_fed_back_stays_within_the_target(capsys, setting, target):
    """The text output's noise is on the safe side of the calibrated one (sigma and b rounded up, r down;
    rounding to nearest is not, about every other time) and, with the clip (rounded down), gives at most
    the target epsilon when it is fed back."""
    argv = ["calibrate", *setting, "--epsilon", str(target), "--delta", "1e-5"]
    out = run_json(capsys, argv)
    exact = out["noise"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert_printed_upper_bounds(printed, out)
    text = printed.splitlines()[0]
    noise = re.search(r"(?:concentration|noise_multiplier|laplace_scale) = (\S+?),? ", text).group(1)
    clip = re.search(r"clip C = (\S+),", text)
    larger_is_more_private = "concentration =" not in text
    assert (float(noise) >= exact) if larger_is_more_private else (float(noise) <= exact), (text, exact)
    clip_option = with_option(setting, "--clip", clip.group(1)) if clip else setting
    fed_back = run_json(capsys, ["account", *clip_option, "--noise", noise, "--delta", "1e-5"])
    assert fed_back["epsilon"] <= target, (text, fed_back["epsilon"])


#: ``account`` settings whose epsilons all print below the bound when rounded to nearest at 4 decimals
#: (2.11922 as 2.1192, 0.935505 as 0.9355, 1.17421 as 1.1742, 2.35292 as 2.3529, and their side-by-side routes)
PRINTED_ACCOUNTS = [
    pytest.param(["--mechanism", "gaussian", "--noise", "1.3", "--sample-rate", "0.05", "--steps", "100"],
                 id="gaussian"),
    pytest.param(["--mechanism", "lap2", "--noise", "2", "--sample-rate", "0.1", "--steps", "10", "--params", "1000"],
                 id="lap2"),
    pytest.param(["--mechanism", "laplace-l1", "--noise", "1", "--sample-rate", "0.1", "--steps", "10"],
                 id="laplace-l1"),
    pytest.param(["--mechanism", "dirichlet", "--noise", "0.08", "--sample-rate", "0.05", "--steps", "200"],
                 id="dirichlet"),
]


def printed_epsilons(text: str) -> tuple[float, dict[str, float]]:
    """The headline epsilon of ``account`` / ``calibrate`` text and the side-by-side ones by accountant."""
    headline = float(re.search(r"epsilon = (\S+) at delta", text).group(1))
    side_by_side = {name: float(eps) for name, eps in re.findall(r"^ +(\S+) +epsilon = (\S+) ", text, re.M)}
    return headline, side_by_side


def assert_printed_upper_bounds(text: str, out: dict) -> None:
    """Each printed epsilon parsed back is >= its value in the JSON output, and within 1e-4 of it."""
    headline, side_by_side = printed_epsilons(text)
    assert out["epsilon"] <= headline <= out["epsilon"] + 1e-4, (text, out["epsilon"])
    assert set(side_by_side) == (set(out["epsilon_by_accountant"]) if len(out["epsilon_by_accountant"]) > 1 else set())
    for name, printed in side_by_side.items():
        exact = out["epsilon_by_accountant"][name]
        assert exact <= printed <= exact + 1e-4, (name, printed, exact)


@pytest.mark.parametrize("setting", PRINTED_ACCOUNTS)
def test_printed_epsilons_are_rounded_up(capsys, setting):
    """Rounded to nearest, each of these epsilons prints below the upper bound it stands for."""
    argv = ["account", *setting, "--delta", "1e-5"]
    out = run_json(capsys, argv)
    assert main(argv) == 0
    assert_printed_upper_bounds(capsys.readouterr().out, out)


def test_audit_prints_the_claim_and_the_lower_bound_on_their_safe_sides(capsys):
    """``audit bound`` text: the claimed epsilon (an upper bound) parsed back is >= the JSON value and
    the exact lower bound <=, so neither is misstated by rounding (both print every digit)."""
    argv = ["audit", "bound", "--mechanism", "gaussian", "--noise", "1", "--sample-rate", "0.1", "--steps", "10",
            "--grid", "4096"]
    out = run_json(capsys, argv)
    assert main(argv) == 0
    printed = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert float(printed["claimed_epsilon"]) >= out["claimed_epsilon"]
    assert float(printed["lower_bound_epsilon"]) <= out["lower_bound_epsilon"]
    assert out["lower_bound_epsilon"] <= out["claimed_epsilon"]


@pytest.mark.parametrize(
    "argv,param",
    [
        (["account", "--mechanism", "gaussian", "--noise", "1", "--sample-rate", "1.5", "--steps", "5", "--delta", "1e-5"], "--sample-rate"),
        (["account", "--mechanism", "gaussian", "--noise", "-1", "--sample-rate", "0.1", "--steps", "5", "--delta", "1e-5"], "noise"),
        (["account", "--mechanism", "gaussian", "--noise", "nan", "--sample-rate", "0.1", "--steps", "5", "--delta", "1e-5"], "noise"),
        (["account", "--mechanism", "gaussian", "--noise", "1", "--sample-rate", "0.1", "--steps", "5", "--delta", "1"], "delta"),
        (["account", "--mechanism", "lap2", "--noise", "1", "--sample-rate", "0.1", "--steps", "5", "--delta", "1e-5", "--params", "0"], "--params"),
        (["account", "--mechanism", "lap2", "--noise", "1", "--sample-rate", "0.1", "--steps", "5", "--delta", "1e-5"], "--params"),
        (["calibrate", "--mechanism", "dirichlet", "--epsilon", "0.01", "--sample-rate", "0.02048", "--epochs", "100", "--delta", "1e-5"], "unreachable"),
    ],
)
def test_invalid_input_exits_2_with_one_line(capsys, argv, param):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and param in err[0]


def test_walls_writes_png(tmp_path):
    out = tmp_path / "walls.png"
    assert main(["walls", "--out", str(out), "--sample-rates", "0.1", "--params", "1000"]) == 0
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"


def test_module_entry_point_help_lists_subcommands():
    proc = subprocess.run([sys.executable, "-m", "dpnoise", "--help"], capture_output=True, text=True, check=True)
    for cmd in ("account", "calibrate", "walls"):
        assert cmd in proc.stdout


def test_a_closed_pipe_ends_the_command_quietly():
    """`dpnoise account ... | head -1`: the reader is gone before the command prints."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "dpnoise", "account", "--mechanism", "gaussian", "--noise", "1",
               "--sample-rate", "1", "--steps", "10", "--delta", "1e-5"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # before the command can have printed anything (imports alone take 0.2 s)
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr
