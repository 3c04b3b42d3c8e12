"""The stream tells Airflow when an event-time day is complete.

When every topic's watermark has passed a new day's end plus the allowed lateness
(:mod:`include.day_complete`), the stream posts an event of the asset
``lambdalake://stream/day_complete`` with ``{"date": "YYYY-MM-DD"}`` through Airflow's REST API,
and ``lambda_nightly_batch`` runs for that day without waiting for its sensor's next poke. Only the
newest complete day that the stream has events of (in Bronze) is posted: older days have their
scheduled runs, and a day without events (before the stream's first, or in a gap) has nothing
the stream could have made exact sooner. The last day posted is kept in
``checkpoints/day-complete-event.json``, so a restarted stream does not post it again.

Airflow being absent, unreachable or refusing is logged once per outage and never stops the
stream: the day is posted at a later check, and the nightly batch's sensor remains the fallback.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import date

from include.airflow_events import AIRFLOW_CONN_ENV, AirflowApi, AirflowUnavailable
from include.assets import DAY_COMPLETE
from include.config import Settings
from include.coverage import bronze_row_counts
from include.day_complete import newest_complete_day, stream_watermark
from include.lakehouse import LakehouseStore
from include.registry import input_topics
from include.views import VIEWS

log = logging.getLogger(__name__)
CHECK_SECONDS = 60.0
STATE_FILE = "day-complete-event.json"


class DayCompleteAnnouncer:
    def __init__(self, settings: Settings, store: LakehouseStore, api: AirflowApi) -> None:
        self.settings = settings
        self.store = store
        self.api = api
        self.state_path = settings.checkpoints_dir / STATE_FILE
        self._failing = False

    @classmethod
    def from_env(cls, settings: Settings, store: LakehouseStore) -> DayCompleteAnnouncer | None:
        """An announcer when the ``lambdalake_airflow`` connection is in the environment; else
        None, said once in the log."""
        try:
            api = AirflowApi.from_env()
        except ValueError as error:
            log.warning("%s is not a usable connection (%s): no day-complete asset events", AIRFLOW_CONN_ENV, error)
            return None
        if api is None:
            log.info("no Airflow connection in %s: no day-complete asset events (the nightly batch's sensor "
                     "decides when a day is complete)", AIRFLOW_CONN_ENV)
            return None
        return cls(settings, store, api)

    def last_posted(self) -> date | None:
        if not self.state_path.exists():
            return None
        return date.fromisoformat(json.loads(self.state_path.read_text(encoding="utf-8"))["date"])

    def _remember(self, day: date) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"date": day.isoformat()}), encoding="utf-8")
        os.replace(temporary, self.state_path)

    def day_to_post(self) -> date | None:
        """The newest complete day with events in Bronze, if it was not posted already."""
        complete = newest_complete_day(self.settings, stream_watermark(self.store, self.settings))
        last = self.last_posted()
        if complete is None or (last is not None and complete <= last):
            return None  # nothing new: Bronze is not read
        counts = [bronze_row_counts(self.store, topic) for topic in input_topics(VIEWS)]
        with_events = {day for count in counts for day, rows in count.items() if day and rows and day <= complete}
        day = max(with_events, default=None)
        return None if day is None or (last is not None and day <= last) else day

    def check(self) -> date | None:
        """Post :meth:`day_to_post`, if any; returns the day posted."""
        day = self.day_to_post()
        if day is None:
            return None
        try:
            self.api.post_asset_event(DAY_COMPLETE, {"date": day.isoformat()})
        except AirflowUnavailable as error:
            if not self._failing:
                log.warning("could not tell Airflow that %s is complete (%s); trying again every %.0f s, and the "
                            "nightly batch's sensor does not need it", day, error, CHECK_SECONDS)
            self._failing = True
            return None
        if self._failing:
            log.info("Airflow at %s answers again", self.api.base_url)
        self._failing = False
        self._remember(day)
        log.info("told Airflow that %s is complete (asset %s)", day, DAY_COMPLETE)
        return day

    def check_safely(self) -> date | None:
        """:meth:`check`, with any failure logged instead of raised: the stream must not die of
        its notice to Airflow."""
        try:
            return self.check()
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("the day-complete check failed; the stream goes on")
            return None

    def run(self, stop: threading.Event, every: float = CHECK_SECONDS) -> None:
        """Check every ``every`` seconds until ``stop``."""
        while not stop.wait(every):
            self.check_safely()
