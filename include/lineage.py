"""The lakehouse tables as OpenLineage datasets: what the DAGs' tasks report they read and write
(docs/lineage.md).

A table is a Delta folder on the local file system, so its dataset follows OpenLineage's naming
for a local path: namespace ``file``, name the folder's absolute path; the provider gives a
``file://`` Airflow asset the same name (:func:`table_uri`). The partitions a run reads or writes
(the day's) go in the dataset's ``subset`` facet, so the dataset stays one per table.

Only the OpenLineage provider calls into this module, and only while lineage is on: with no
transport configured nothing here is imported or computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset

    from include.config import Settings

# A partition as column -> value, e.g. {"date": "2026-11-20"}.
Partition = Mapping[str, str]


@dataclass(frozen=True)
class Lineage:
    """The tables a task reads and writes, by name (``bronze/orders``); per table the partitions
    it touches, or none for the whole table."""

    reads: Mapping[str, Sequence[Partition]] = field(default_factory=dict)
    writes: Mapping[str, Sequence[Partition]] = field(default_factory=dict)


def table_path(settings: Settings, table: str) -> Path:
    return settings.lakehouse_dir / table


def table_uri(settings: Settings, table: str) -> str:
    """The table as a ``file://`` URI, which the provider names as :func:`dataset` does."""
    return table_path(settings, table).as_uri()


def dataset(settings: Settings, table: str, partitions: Sequence[Partition] = (), *,
            output: bool = False) -> InputDataset | OutputDataset:
    """The table's OpenLineage dataset; ``partitions``: the ones this run reads (or writes)."""
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import base_subset_dataset as subset
    from openlineage.client.naming.dataset import LocalFileSystem

    naming = LocalFileSystem(str(table_path(settings, table)))
    condition = subset.PartitionSubsetCondition(
        partitions=[subset.Partition(dimensions=dict(partition)) for partition in partitions]
    )
    if output:
        facets = {"subset": subset.OutputSubsetOutputDatasetFacet(outputCondition=condition)} if partitions else {}
        return OutputDataset(naming.get_namespace(), naming.get_name(), outputFacets=facets)
    facets = {"subset": subset.InputSubsetInputDatasetFacet(inputCondition=condition)} if partitions else {}
    return InputDataset(naming.get_namespace(), naming.get_name(), inputFacets=facets)


def operator_lineage(settings: Settings, lineage: Lineage) -> OperatorLineage:
    """What an operator's ``get_openlineage_facets_on_start`` returns for ``lineage``."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(
        inputs=[dataset(settings, table, partitions) for table, partitions in lineage.reads.items()],
        outputs=[dataset(settings, table, partitions, output=True) for table, partitions in lineage.writes.items()],
    )


def report(settings: Settings, lineage: Lineage, reporter: Any) -> None:
    """For a Python task (``reporter``: the task): hand its tables to Airflow's hook-lineage
    collector, which the provider reads when the task ends. When lineage is off the collector is
    Airflow's no-op. Partitions are not passed on: the collector takes assets, not facets."""
    from airflow.providers.common.compat.lineage.hook import get_hook_lineage_collector

    collector = get_hook_lineage_collector()
    for table in lineage.reads:
        collector.add_input_asset(reporter, uri=table_uri(settings, table))
    for table in lineage.writes:
        collector.add_output_asset(reporter, uri=table_uri(settings, table))
