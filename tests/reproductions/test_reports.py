"""The reports read records from the record folders only."""

from __future__ import annotations

from reproductions import plans
from reproductions.reports import write_aggregates


def test_every_experiment_writes_into_a_record_folder():
    specs = [*plans.table2_specs(["mnist"], [1.0], [0]), *plans.dirichlet_specs(["mnist"], [1.0], [0]),
             *plans.alpha_grid_specs("mnist", [0]), *plans.finetune_specs(["sst2"], [1.0], [0]),
             *plans.finetune_full_specs(["sst2"], [1.0], [0]), *plans.scatternet_specs(["mnist"], [1.0], [0]),
             *plans.clipping_specs(["fashion-mnist"], [1.0], [0])]
    assert {spec.experiment for spec in specs} == set(plans.RECORD_FOLDERS)


def test_a_half_written_json_in_the_logs_folder_is_not_read_as_a_record(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "reference.json").write_text("")  # a run still writing its summary there
    (tmp_path / "finetune-full").mkdir()
    assert write_aggregates(tmp_path) == []
