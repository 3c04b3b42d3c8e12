"""The Airflow assets of the platform, as URIs (the DAGs wrap them in ``Asset``; the stream posts
events of them through the REST API)."""

from __future__ import annotations

from include.views import VIEWS

# An event-time day is complete (include.day_complete); the event's extra: {"date": "YYYY-MM-DD"}.
DAY_COMPLETE = "lambdalake://stream/day_complete"
# Each Gold view's batch side, published when the nightly batch has covered a day.
BATCH_VIEWS = [f"lambdalake://batch/{view.name}" for view in VIEWS]
