"""A user's own data set by its source name: CSV, JSON, parquet, an image folder, a saved datasets folder."""

import csv
import json

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")

from dpnoise.data import (  # noqa: E402
    InvalidDatasetError,
    dataset_info,
    label_names,
    load_dataset,
    register_file_dataset,
)


def write_csv(path, rows, header=("review", "stars")):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def reviews(count=60):
    kinds = ["good", "bad", "okay"]
    return [[f"a {kinds[i % 3]} film number {i}", kinds[i % 3]] for i in range(count)]


def test_a_csv_with_string_labels_holds_out_a_tenth_of_the_rows_each_by_its_own_content(tmp_path):
    name = f"csv:{write_csv(tmp_path / 'reviews.csv', reviews(300))}"
    info = register_file_dataset(name, text_column="review", label_column="stars")
    assert (info.modality, info.num_classes) == ("text", 3) and info.train_size + info.test_size == 300
    assert 15 <= info.test_size <= 45  # each row held out with probability 0.1
    assert label_names(name) == ("bad", "good", "okay") and dataset_info(name) is info
    train, test = load_dataset(name, "train"), load_dataset(name, "test")
    assert not set(train.sentences) & set(test.sentences)  # held out, not repeated
    assert all(int(label) == ("bad", "good", "okay").index(sentence.split()[1])
               for sentence, label in zip(train.sentences, train.labels))
    again = register_file_dataset(name, text_column="review", label_column="stars")
    assert load_dataset(name, "test").sentences == test.sentences and again == info  # deterministic
    assert len(load_dataset(name, "train", limit=9)) == 9
    # one more row (anywhere in the file) moves no other row between the splits: neighbouring files' training
    # splits differ in that row at most, which the epsilon of the training split assumes
    rows = reviews(300)
    rows.insert(17, ["a good film that was added", "good"])
    grown = f"csv:{write_csv(tmp_path / 'grown.csv', rows)}"
    register_file_dataset(grown, text_column="review", label_column="stars")
    added = set(load_dataset(grown, "train").sentences) ^ set(train.sentences)
    assert added <= {"a good film that was added"}
    assert set(load_dataset(grown, "test").sentences) - set(test.sentences) <= {"a good film that was added"}


def test_json_lines_with_integer_labels_and_sentence_pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"text": f"q{i}", "answer": f"a{i}", "label": i % 4}) + "\n" for i in range(40)))
    name = f"json:{path}"
    info = register_file_dataset(name, text_pair_column="answer")
    assert info.num_classes == 4 and label_names(name) == ("0", "1", "2", "3")
    train = load_dataset(name, "train")
    assert all(pair == "a" + sentence[1:] for sentence, pair in zip(train.sentences, train.pairs))


def test_a_saved_dataset_dict_keeps_its_own_evaluation_split(tmp_path):
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"sentence": [f"s{i}" for i in range(20)], "label": [i % 2 for i in range(20)]}),
        "validation": datasets.Dataset.from_dict({"sentence": ["v0", "v1", "v2"], "label": [1, 0, 1]}),
    })
    splits.save_to_disk(str(tmp_path / "saved"))
    name = f"disk:{tmp_path / 'saved'}"
    info = register_file_dataset(name)
    assert (info.train_size, info.test_size) == (20, 3) and load_dataset(name, "test").sentences == ["v0", "v1", "v2"]
    parquet = tmp_path / "data.parquet"
    splits["train"].to_parquet(str(parquet))
    assert register_file_dataset(f"parquet:{parquet}").train_size == 18


def image_folder(root, sizes=((12, 12), (12, 12), (16, 10))):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, name in enumerate(("cats", "dogs", "owls")):
        (root / name).mkdir(parents=True)
        for i in range(10):
            size = sizes[i % len(sizes)]
            Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def test_an_image_folder_gives_one_class_per_folder_at_the_first_images_size(tmp_path):
    name = f"imagefolder:{image_folder(tmp_path / 'pics')}"
    info = register_file_dataset(name)
    assert (info.modality, info.num_classes, info.input_shape) == ("image", 3, (3, 12, 12))
    assert label_names(name) == ("cats", "dogs", "owls") and info.train_size + info.test_size == 30
    raw, standardised = load_dataset(name, "train", normalize=False), load_dataset(name, "train")
    assert 0 <= raw.tensors[0].min() and raw.tensors[0].max() <= 1
    torch.testing.assert_close(standardised.tensors[0], (raw.tensors[0] - 0.5) / 0.5)


@pytest.mark.parametrize("problem", ["missing", "column", "empty", "one-class", "unseen-label", "image"])
def test_bad_data_is_refused_naming_the_file_row_or_column(tmp_path, problem):
    if problem == "missing":
        name, match = f"csv:{tmp_path / 'none.csv'}", "no such file"
    elif problem == "column":
        name, match = f"csv:{write_csv(tmp_path / 'r.csv', reviews())}", "no label column 'label' .columns: review, stars"
    elif problem == "empty":
        name, match = f"csv:{write_csv(tmp_path / 'e.csv', [])}", "no rows|cannot read it"
    elif problem == "one-class":
        name, match = f"csv:{write_csv(tmp_path / 'o.csv', [[f't{i}', 'x'] for i in range(9)], ('text', 'label'))}", \
            "1 class"
    elif problem == "unseen-label":
        datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a", "b"], "label": ["x", "y"]}),
                              "test": datasets.Dataset.from_dict({"text": ["c"], "label": ["z"]})}
                             ).save_to_disk(str(tmp_path / "u"))
        name, match = f"disk:{tmp_path / 'u'}", "label 'z' of the evaluation split is not in the training split"
    else:
        folder = image_folder(tmp_path / "pics")
        (folder / "dogs" / "3.png").write_bytes(b"not an image")
        name, match = f"imagefolder:{folder}", "cannot read image .*3.png"
    with pytest.raises(InvalidDatasetError, match=match):
        register_file_dataset(name)
