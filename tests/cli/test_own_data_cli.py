"""dpnoise train on a user's own files (generated here): a multi-class CSV and an image folder."""

import json

import numpy as np
import pytest

pytest.importorskip("datasets")

from dpnoise.cli.main import main  # noqa: E402

COMMON = ["--mechanism", "gaussian", "--epsilon", "3", "--delta", "1e-5", "--epochs", "3", "--batch-size", "32",
          "--threads", "1", "--no-progress", "--seed", "0", "--json"]


def run(capsys, *argv):
    try:
        code = main(["train", *argv])
    except SystemExit as exit_:  # argparse's refusals
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured


def test_a_csv_with_three_string_classes_trains_and_saves_its_label_names(tmp_path, capsys):
    words = {"pos": "great good lovely", "neg": "bad awful poor", "mid": "okay plain average"}
    rows = ["opinion,stars"] + [f"{words[k].split()[i % 3]} {words[k].split()[(i + 1) % 3]} film,{k}"
                                for i in range(120) for k in words]
    (tmp_path / "reviews.csv").write_text("\n".join(rows) + "\n")
    code, out = run(capsys, "--dataset", f"csv:{tmp_path / 'reviews.csv'}", "--text-column", "opinion",
                    "--label-column", "stars", "--model", "minilm-features", "--lr", "0.1", "--out",
                    str(tmp_path / "run"), *COMMON)
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert summary["dataset"] == f"csv:{tmp_path / 'reviews.csv'}" and summary["epsilon"] <= 3
    assert summary["test_accuracy"] > 0.5  # three classes, separable words
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == {"labels": ["mid", "neg", "pos"]}


def test_an_image_folder_trains_the_cnn_sized_for_it(tmp_path, capsys):
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, level in (("dark", 40), ("grey", 128), ("light", 220)):
        (tmp_path / "pics" / name).mkdir(parents=True)
        for i in range(40):
            pixels = np.clip(rng.normal(level, 20, (10, 10)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "pics" / name / f"{i}.png")
    code, out = run(capsys, "--dataset", f"imagefolder:{tmp_path / 'pics'}", "--model", "cnn", "--lr", "0.01", *COMMON)
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert summary["epsilon"] <= 3 and 0 <= summary["test_accuracy"] <= 1


@pytest.mark.parametrize("argv,message", [
    (["--dataset", "digits", "--text-column", "text"], "--text-column applies to your own data"),
    (["--dataset", "csv:/no/such/file.csv"], "--dataset csv:/no/such/file.csv: no such file"),
    (["--dataset", "tsv:/some/file"], "argument --dataset: invalid choice: 'tsv:/some/file'"),
])
def test_own_data_options_are_checked_and_name_the_flag(capsys, argv, message):
    code, out = run(capsys, *argv, "--model", "cnn", *COMMON)
    assert code == 2 and message in out.err and len(out.err.strip().splitlines()) == 1, out.err


def test_a_user_column_makes_the_epsilon_per_user(tmp_path, capsys):
    rows = ["opinion,stars,user"] + [f"{'great good' if i % 2 else 'bad awful'} film {i},{'pos' if i % 2 else 'neg'},"
                                     f"u{i % 30}" for i in range(240)]
    (tmp_path / "reviews.csv").write_text("\n".join(rows) + "\n")
    data = ["--dataset", f"csv:{tmp_path / 'reviews.csv'}", "--text-column", "opinion", "--label-column", "stars",
            "--model", "minilm-features", "--lr", "0.1"]
    options = ["--mechanism", "gaussian", "--epsilon", "3", "--delta", "1e-5", "--epochs", "3", "--batch-size", "6",
               "--threads", "1", "--no-progress", "--seed", "0"]
    code, out = run(capsys, *data, "--privacy-unit", "user", *options, "--json")
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert summary["privacy_units"] == 30 and summary["sample_rate"] == pytest.approx(6 / 30)
    assert summary["epsilon"] <= 3
    code, out = run(capsys, *data, "--privacy-unit", "user", *options)
    assert "per privacy unit (each of the 30 units with all its examples)" in out.out
    code, out = run(capsys, *data, "--privacy-unit", "account", *options)
    assert code == 2 and "no privacy-unit column 'account'" in out.err


def test_a_subset_of_your_own_file_is_refused(tmp_path, capsys):
    rows = ["text,label"] + [f"sentence {i},{i % 2}" for i in range(40)]
    (tmp_path / "rows.csv").write_text("\n".join(rows) + "\n")
    code, out = run(capsys, "--dataset", f"csv:{tmp_path / 'rows.csv'}", "--model", "minilm-features", "--limit", "10",
                    *COMMON)
    assert code == 2 and "--limit with your own data" in out.err
