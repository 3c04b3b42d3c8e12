"""The lakehouse tables as OpenLineage datasets: one name per table, the provider's own for its
``file://`` URI, and what each Spark step declares. (A real nightly run's events are checked in
tests/dags/test_nightly_batch_dag.py.)"""

from __future__ import annotations

from airflow.providers.common.compat.openlineage.utils.utils import translate_airflow_asset
from airflow.sdk import Asset
from airflow.sdk.lineage import NoOpCollector

from batch_layer.job import lineage as job_lineage
from include.lineage import Lineage, dataset, operator_lineage, report, table_uri


def test_a_table_is_its_folder_in_the_file_namespace_as_the_provider_names_a_file_uri(settings):
    read = dataset(settings, "bronze/orders", [{"event_date": "2026-11-20"}])
    assert (read.namespace, read.name) == ("file", f"{settings.home}/lakehouse/bronze/orders")
    provider = translate_airflow_asset(Asset(table_uri(settings, "bronze/orders")), None)
    assert (provider.namespace, provider.name) == (read.namespace, read.name)
    condition = read.inputFacets["subset"].inputCondition
    assert [p.dimensions for p in condition.partitions] == [{"event_date": "2026-11-20"}]


def test_a_whole_table_has_no_subset_and_outputs_are_output_datasets(settings):
    tables = Lineage(reads={"speed/customers": []}, writes={"reconciliation": [{"date": "2026-11-20"}]})
    lineage = operator_lineage(settings, tables)
    (read,), (written,) = lineage.inputs, lineage.outputs
    assert read.inputFacets == {} and read.name.endswith("/lakehouse/speed/customers")
    assert written.outputFacets["subset"].outputCondition.partitions[0].dimensions == {"date": "2026-11-20"}


def test_reconcile_reads_the_days_batch_and_speed_views_and_writes_reconciliation(settings, monkeypatch):
    monkeypatch.setenv("LAMBDALAKE_HOME", str(settings.home))
    step = job_lineage(["reconcile", "--date", "2026-11-20"])
    day = [{"date": "2026-11-20"}]
    assert step.reads["batch/order_payments"] == day and step.reads["speed/order_payments"] == day
    assert step.reads["speed/customers"] == []  # a dimension: its state as of the day's end
    assert step.writes["reconciliation"] == day and step.writes["recovered_late_matches"] == day
    assert not any(table.startswith("bronze/") for table in step.reads)


def test_with_lineage_off_reporting_goes_to_airflows_no_op_collector(settings, monkeypatch):
    monkeypatch.delenv("AIRFLOW__OPENLINEAGE__TRANSPORT", raising=False)
    from airflow.providers.common.compat.lineage.hook import get_hook_lineage_collector
    from airflow.providers.openlineage import conf

    assert conf.is_disabled()
    assert isinstance(get_hook_lineage_collector(), NoOpCollector)
    report(settings, Lineage(writes={"ops/batch_coverage": []}), object())  # nothing to see, nothing raised


def test_recompute_reads_the_days_bronze_partitions_and_a_dimensions_topic_whole(settings, monkeypatch):
    monkeypatch.setenv("LAMBDALAKE_HOME", str(settings.home))
    step = job_lineage(["recompute", "--date", "2026-11-20"])
    assert {"event_date": "2026-11-20"} in step.reads["bronze/orders"]
    assert step.reads["bronze/customers_cdc"] == []  # the customer dimension: its whole history
    assert set(step.writes) == {f"batch/{view}" for view in (
        "revenue_by_category_5m", "order_payments", "traffic_by_page_10m", "device_health_5m", "user_sessions",
        "alerts", "customers", "customers_history", "revenue_by_segment_1h")} | {"ops/batch_coverage"}  # a rerun's mark
