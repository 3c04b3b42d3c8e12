"""kill -9 of the stream, again and again, while the nightly batch of an earlier day and the
maintenance (compaction, vacuum) run on the same lake and are killed too (the harness: chaos.py;
``benchmarks/faults.py`` runs it with 20 kills). Nothing lost, nothing doubled, the batch's
reruns give the same rows, no referenced file missing. Vacuum without any retention, run while
the stream lies killed mid-batch, takes nothing the stream's replay or a table's version needs."""

from __future__ import annotations

import pytest
from chaos import DAY_ONE, Chaos, batch_rows

from include.lakehouse import open_store

pytestmark = pytest.mark.slow
KILLS = 2  # the full 20 in benchmarks/faults.py


def test_kill_9_beside_batch_and_maintenance_loses_doubles_and_breaks_nothing(spark, tmp_path):
    chaos = Chaos(tmp_path / "home", kills=KILLS, seed=44)
    generated = chaos.prepare()
    day_one = batch_rows(chaos.settings, DAY_ONE)
    chaos.run_all()
    print("\n".join(chaos.log), *chaos.side_runs, sep="\n")

    chaos.verify(open_store(chaos.settings, spark), generated, day_one)
