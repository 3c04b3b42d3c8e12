"""The Gold views, each a definition (Spark SQL over its topics, or DataFrames -> DataFrame) with
its spec declared on it, in the module of its family; both layers run them, and everything else
loops over :data:`VIEWS`.

The speed layer applies a definition to each micro-batch's on-time, deduplicated events
(``exact=False``: approximate where exactness needs unbounded state, orders still inside their
join window shown as ``pending``); the batch layer applies the same definition to a day's full
history (``exact=True``). Event dedup, the first-payment rule and the ``pending`` rule live here
too, so the layers cannot drift apart.

Adding a view: its definition with its ``@view`` spec in its family's module (a new family: a
module listed in :data:`FAMILIES`), its ground truth in the generator, its tests. Nothing else
names it. (DAG files
import :data:`VIEWS` at parse time, so pyspark is imported inside the definitions.)
"""

from __future__ import annotations

from datetime import date, timedelta

from include.config import ConfigError, Settings
from include.registry import ViewSpec
from include.views import alerting, cdc, clicks, devices, orders

FAMILIES = (orders, clicks, devices, alerting, cdc)
# Every view the families declare, in the order they declare them (``status``, the dashboard and
# reconciliation list them so).
VIEWS: list[ViewSpec] = [spec for family in FAMILIES for spec in vars(family).values()
                         if isinstance(spec, ViewSpec) and spec.define.__module__ == family.__name__]
VIEWS_BY_NAME: dict[str, ViewSpec] = {view.name: view for view in VIEWS}


def speed_views(settings: Settings) -> list[ViewSpec]:
    """The views the speed layer maintains (``LAMBDALAKE_SPEED_VIEWS``, default all, with the
    dimensions they look up), in registry order."""
    names = [name.strip() for name in settings.speed_views.split(",") if name.strip()]
    unknown = [name for name in names if name not in VIEWS_BY_NAME]
    if unknown:
        raise ConfigError(f"invalid setting LAMBDALAKE_SPEED_VIEWS={settings.speed_views}: unknown view "
                          f"{', '.join(map(repr, unknown))} (views: {', '.join(VIEWS_BY_NAME)})")
    wanted = set(names)
    for name in names:  # a view's lookups run with it
        wanted.update(VIEWS_BY_NAME[name].lookups)
    return [view for view in VIEWS if not names or view.name in wanted]


def speed_trigger_intervals(settings: Settings) -> dict[str, timedelta]:
    """Each speed view's interval when the stream runs continuously: its own from
    ``LAMBDALAKE_VIEW_TRIGGERS``, else ``LAMBDALAKE_TRIGGER_INTERVAL`` or, if longer, its spec's
    ``refresh``. A view that need not be fresh within seconds, on a longer interval, leaves the
    cores to those that must be. A view ingest computes runs in its micro-batches: every one, or
    every its interval if it :attr:`~include.registry.ViewSpec.runs_on_interval` (never more often
    than ingest)."""
    given = settings.view_trigger_intervals
    unknown = [name for name in given if name not in VIEWS_BY_NAME]
    if unknown:
        raise ConfigError(f"invalid setting LAMBDALAKE_VIEW_TRIGGERS={settings.view_triggers}: unknown view "
                          f"{', '.join(map(repr, unknown))} (views: {', '.join(VIEWS_BY_NAME)})")
    every_batch = [name for name in given
                   if VIEWS_BY_NAME[name].in_ingest_pass and not VIEWS_BY_NAME[name].runs_on_interval]
    if every_batch:
        raise ConfigError(f"invalid setting LAMBDALAKE_VIEW_TRIGGERS={settings.view_triggers}: ingest computes "
                          f"{', '.join(map(repr, every_batch))} in each of its micro-batches "
                          "(LAMBDALAKE_TRIGGER_INTERVAL): its state follows them one by one")
    trigger = settings.trigger_interval
    intervals = {view.name: given.get(view.name, max(trigger, view.speed.refresh or timedelta(0)))
                 for view in speed_views(settings)}
    return {name: max(trigger, interval) if VIEWS_BY_NAME[name].in_ingest_pass else interval
            for name, interval in intervals.items()}


# Nightly data quality: the same orders must appear in both order views.
CONSISTENT_METRICS = [(("revenue_by_category_5m", "orders"), ("order_payments", "rows")),
                      (("revenue_by_segment_1h", "orders"), ("order_payments", "rows"))]


def days_read(settings: Settings, day: date) -> tuple[dict[str, set[date]], set[str]]:
    """What rebuilding ``day`` reads, without opening a table: per topic the event days the fact
    views read, and the topics a dimension reads whole (their history up to the day's end)."""
    days: dict[str, set[date]] = {}
    whole: set[str] = set()
    for view in VIEWS:
        for topic in view.inputs:
            if view.kind == "dimension":
                whole.add(topic)
            else:
                days.setdefault(topic, set()).update(view.input_days(topic, day, settings))
    return days, whole
