"""The ground-truth ledger, computed from the generated events in plain Python.

It deliberately shares no code with the pipeline: tests compare the pipeline's output with it.
"""

from __future__ import annotations

import bisect
import csv
import json
import math
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

from include.generator.simulation import Event, Line, iso_utc

WINDOW = timedelta(minutes=5)
REVENUE_COLUMNS = ("window_start", "window_end", "category", "revenue", "orders", "unique_buyers")
TRAFFIC_WINDOW, TRAFFIC_SLIDE = timedelta(minutes=10), timedelta(minutes=5)
TRAFFIC_COLUMNS = ("window_start", "window_end", "page_url", "views", "clicks", "add_to_cart", "unique_users")
DEVICE_COLUMNS = ("window_start", "window_end", "device_id", "readings", "avg_temperature", "min_temperature",
                  "max_temperature", "stddev_temperature", "avg_humidity")
SESSION_GAP = timedelta(minutes=30)
# ``in_batch``: the exact row the batch layer must produce; ``in_stream``: the row the speed layer
# must show, computed from the events that were not late (the stream never sees late ones).
SESSION_COLUMNS = ("user_id", "session_start", "session_end", "events", "pages", "duration_seconds", "converted",
                   "in_batch", "in_stream")
ALERT_COLUMNS = ("alert_id", "kind", "entity_id", "event_time", "value", "threshold", "in_batch", "in_stream")
ANOMALY_LOOKBACK, ANOMALY_MIN_READINGS, ANOMALY_SIGMAS = timedelta(minutes=15), 5, 3
ORDER_PAYMENT_COLUMNS = (
    "order_id", "user_id", "category", "amount", "order_time",
    "payment_id", "paid_amount", "pay_time", "status", "late_paid",
)


def window_start(moment: datetime) -> datetime:
    epoch = int(moment.timestamp())
    return datetime.fromtimestamp(epoch - epoch % int(WINDOW.total_seconds()), timezone.utc)


def revenue_by_category_5m(orders: list[Event]) -> list[dict]:
    groups: dict[tuple[datetime, str], list[Event]] = defaultdict(list)
    for order in orders:
        groups[(window_start(order.event_time), order.payload["category"])].append(order)
    return [
        {
            "window_start": iso_utc(start),
            "window_end": iso_utc(start + WINDOW),
            "category": category,
            "revenue": round(sum(o.payload["amount"] for o in members), 2),
            "orders": len(members),
            "unique_buyers": len({o.payload["user_id"] for o in members}),
        }
        for (start, category), members in sorted(groups.items())
    ]


def traffic_by_page_10m(clicks: list[Event]) -> list[dict]:
    """Each click counts in the two 10-minute windows (starting every 5 minutes) that contain it."""
    groups: dict[tuple[int, str], list[Event]] = defaultdict(list)  # by window start in epoch seconds
    slide = int(TRAFFIC_SLIDE.total_seconds())
    for click in clicks:
        epoch = int(click.event_time.timestamp())
        latest = epoch - epoch % slide
        page = click.payload["page_url"]
        groups[(latest - slide, page)].append(click)
        groups[(latest, page)].append(click)
    rows = []
    for (epoch, page), members in sorted(groups.items()):
        start = datetime.fromtimestamp(epoch, timezone.utc)
        actions = Counter(c.payload["action"] for c in members)
        rows.append({
            "window_start": iso_utc(start), "window_end": iso_utc(start + TRAFFIC_WINDOW), "page_url": page,
            "views": actions["view"], "clicks": actions["click"], "add_to_cart": actions["add_to_cart"],
            "unique_users": len({c.payload["user_id"] for c in members}),
        })
    return rows


def device_health_5m(readings: list[Event]) -> list[dict]:
    groups: dict[tuple[datetime, str], list[Event]] = defaultdict(list)
    for reading in readings:
        groups[(window_start(reading.event_time), reading.payload["device_id"])].append(reading)
    rows = []
    for (start, device), members in sorted(groups.items()):
        temperatures = [r.payload["temperature"] for r in members]
        n, mean = len(temperatures), sum(temperatures) / len(temperatures)
        rows.append({
            "window_start": iso_utc(start), "window_end": iso_utc(start + WINDOW), "device_id": device,
            "readings": n, "avg_temperature": mean,
            "min_temperature": min(temperatures), "max_temperature": max(temperatures),
            "stddev_temperature": math.sqrt(sum((t - mean) ** 2 for t in temperatures) / (n - 1)) if n > 1 else None,
            "avg_humidity": sum(r.payload["humidity"] for r in members) / n,
        })
    return rows


def user_sessions(clicks: list[Event]) -> list[dict]:
    """Per user, clicks at most the gap apart form one session (more than the gap: two)."""
    by_user: dict[str, list[Event]] = defaultdict(list)
    for click in clicks:
        by_user[click.payload["user_id"]].append(click)
    rows = []
    for user, members in sorted(by_user.items()):
        members.sort(key=lambda c: c.event_time)
        session = [members[0]]
        for click in members[1:] + [None]:
            if click is not None and click.event_time - session[-1].event_time <= SESSION_GAP:
                session.append(click)
                continue
            first, last = session[0].event_time, session[-1].event_time
            rows.append({
                "user_id": user, "session_start": iso_utc(first), "session_end": iso_utc(last), "events": len(session),
                "pages": len({c.payload["page_url"] for c in session}),
                "duration_seconds": (last - first).total_seconds(),
                "converted": any(c.payload["action"] == "add_to_cart" for c in session),
            })
            session = [click]
    return rows


def alerts(readings: list[Event], orders: list[Event], temperature_limit: float, velocity_limit: int) -> list[dict]:
    """Every alert condition the events hold, by the rules of docs/views.md."""
    rows = []

    def alert(kind: str, entity: str, moment: datetime, value: float, threshold: float) -> None:
        rows.append({"alert_id": f"{kind}|{entity}|{iso_utc(moment)}", "kind": kind, "entity_id": entity,
                     "event_time": iso_utc(moment), "value": value, "threshold": threshold})

    by_device: dict[str, list[Event]] = defaultdict(list)
    for reading in readings:
        by_device[reading.payload["device_id"]].append(reading)
    for device, members in sorted(by_device.items()):
        members.sort(key=lambda r: r.event_time)
        times = [r.event_time for r in members]
        for i, reading in enumerate(members):
            temperature = reading.payload["temperature"]
            if temperature > temperature_limit:
                alert("high_temperature", device, reading.event_time, temperature, temperature_limit)
            first = bisect.bisect_left(times, reading.event_time - ANOMALY_LOOKBACK)
            before = [r.payload["temperature"] for r in members[first:i]]
            if len(before) < ANOMALY_MIN_READINGS:
                continue
            # Hundredths of a degree as integers: the comparison is exact.
            n, x = len(before), round(temperature * 100)
            total, squares = sum(round(t * 100) for t in before), sum(round(t * 100) ** 2 for t in before)
            spread, distance = n * squares - total * total, n * x - total
            if spread > 0 and distance * distance * (n - 1) > ANOMALY_SIGMAS ** 2 * n * spread:
                alert("temperature_anomaly", device, reading.event_time,
                      float(distance) / math.sqrt(float(n * spread) / (n - 1)), ANOMALY_SIGMAS)
    windows: Counter = Counter((o.payload["user_id"], window_start(o.event_time)) for o in orders)
    for (user, start), count in sorted(windows.items()):
        if count > velocity_limit:
            alert("order_velocity", user, start, count, velocity_limit)
    return sorted(rows, key=lambda r: r["alert_id"])


CUSTOMER_COLUMNS = ("customer_id", "name", "email", "segment", "country", "updated_at")
CUSTOMER_HISTORY_COLUMNS = (
    "customer_id", "name", "email", "segment", "country", "valid_from", "valid_to", "is_current"
)
SEGMENT_COLUMNS = ("window_start", "window_end", "segment", "revenue", "orders")
ORDER_SEGMENT_COLUMNS = ("order_id", "user_id", "order_time", "amount", "segment_at_order", "segment_at_end", "late")
UNKNOWN_SEGMENT = "unknown"


def customer_versions(changes: list[Event]) -> dict[str, list[dict]]:
    """Per customer, its changes in ``ts_ms`` order (equal ``ts_ms``: the later arrival only),
    each with the time the next one replaced it."""
    by_customer: dict[str, list[Event]] = defaultdict(list)
    for event in changes:
        image = event.payload["after"] or event.payload["before"]
        by_customer[image["customer_id"]].append(event)
    versions = {}
    for customer, events in by_customer.items():
        events.sort(key=lambda e: (e.payload["ts_ms"], e.arrival))
        kept = [e for i, e in enumerate(events)
                if i + 1 == len(events) or events[i + 1].payload["ts_ms"] != e.payload["ts_ms"]]
        versions[customer] = [
            {"op": e.payload["op"], "image": e.payload["after"] or e.payload["before"], "from": e.event_time,
             "to": kept[i + 1].event_time if i + 1 < len(kept) else None}
            for i, e in enumerate(kept)
        ]
    return versions


def customers(versions: dict[str, list[dict]]) -> list[dict]:
    """SCD1: each customer's last change, unless it is a delete."""
    rows = []
    for customer, changes in sorted(versions.items()):
        last = changes[-1]
        if last["op"] != "d":
            rows.append({**{k: last["image"][k] for k in CUSTOMER_COLUMNS[:5]}, "updated_at": iso_utc(last["from"])})
    return rows


def customers_history(versions: dict[str, list[dict]]) -> list[dict]:
    """SCD2: a version per change but deletes, valid until the next change."""
    return [
        {**{k: change["image"][k] for k in CUSTOMER_COLUMNS[:5]}, "valid_from": iso_utc(change["from"]),
         "valid_to": iso_utc(change["to"]) if change["to"] else None, "is_current": change["to"] is None}
        for customer, changes in sorted(versions.items()) for change in changes if change["op"] != "d"
    ]


def segment_at(versions: dict[str, list[dict]], customer: str, moment: datetime | None) -> str:
    """The customer's segment at ``moment`` (None: after every change), or ``unknown``."""
    for change in reversed(versions.get(customer, [])):
        if moment is None or change["from"] <= moment:
            return UNKNOWN_SEGMENT if change["op"] == "d" else change["image"]["segment"] or UNKNOWN_SEGMENT
    return UNKNOWN_SEGMENT


def order_segments(orders: list[Event], versions: dict[str, list[dict]]) -> list[dict]:
    """Each order's segment at its time (the batch's point-in-time join) and after every change
    (what the stream joins once its dimension has applied every change, as in one
    ``--available-now`` run)."""
    return [
        {"order_id": o.event_id, "user_id": o.payload["user_id"], "order_time": iso_utc(o.event_time),
         "amount": o.payload["amount"], "segment_at_order": segment_at(versions, o.payload["user_id"], o.event_time),
         "segment_at_end": segment_at(versions, o.payload["user_id"], None), "late": o.late}
        for o in sorted(orders, key=lambda o: (o.event_time, o.event_id))
    ]


def revenue_by_segment_1h(enriched: list[dict]) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for order in enriched:
        groups[(order["order_time"][:13], order["segment_at_order"])].append(order)
    rows = []
    for (hour, segment), members in sorted(groups.items()):
        start = datetime.fromisoformat(hour + ":00:00+00:00")
        rows.append({"window_start": iso_utc(start), "window_end": iso_utc(start + timedelta(hours=1)),
                     "segment": segment, "revenue": round(sum(o["amount"] for o in members), 2),
                     "orders": len(members)})
    return rows


def in_layers(everything: list[dict], on_time: list[dict], key: tuple[str, ...]) -> list[dict]:
    """Rows of both computations, flagged by which one holds them (identical rows match)."""
    def ident(row: dict) -> tuple:
        return tuple(row[k] for k in key)

    batch, stream = {ident(r): r for r in everything}, {ident(r): r for r in on_time}
    rows = []
    for k in sorted(set(batch) | set(stream)):
        if k in batch and k in stream and batch[k] != stream[k]:  # the same key with other values: two rows
            rows += [{**batch[k], "in_batch": True, "in_stream": False},
                     {**stream[k], "in_batch": False, "in_stream": True}]
        else:
            rows.append({**(batch.get(k) or stream[k]), "in_batch": k in batch, "in_stream": k in stream})
    return rows


def order_payments(orders: list[Event], payments: list[Event], join_window: timedelta) -> list[dict]:
    """Each order with its first payment inside ``[order_time, order_time + join_window]``."""
    by_order: dict[str, list[Event]] = defaultdict(list)
    for payment in payments:
        by_order[payment.payload["order_id"]].append(payment)
    rows = []
    for order in sorted(orders, key=lambda o: (o.event_time, o.event_id)):
        inside = [
            p for p in by_order.get(order.event_id, [])
            if order.event_time <= p.event_time <= order.event_time + join_window
        ]
        first = min(inside, key=lambda p: (p.event_time, p.event_id)) if inside else None
        rows.append(
            {
                "order_id": order.event_id,
                "user_id": order.payload["user_id"],
                "category": order.payload["category"],
                "amount": order.payload["amount"],
                "order_time": iso_utc(order.event_time),
                "payment_id": first.event_id if first else None,
                "paid_amount": first.payload["amount"] if first else None,
                "pay_time": iso_utc(first.event_time) if first else None,
                "status": "paid" if first else "unpaid",
                # The stream cannot see this match: the order or its payment arrived late.
                "late_paid": bool(first and (order.late or first.late)),
            }
        )
    return rows


def _by_customer(changes: list[Event]) -> dict[str, list[Event]]:
    """Each customer's changes in ``ts_ms`` order."""
    grouped: dict[str, list[Event]] = defaultdict(list)
    for event in sorted(changes, key=lambda e: e.payload["ts_ms"]):
        grouped[(event.payload["after"] or event.payload["before"])["customer_id"]].append(event)
    return grouped


def topic_counts(events: list[Event], lines: list[Line]) -> dict[str, dict]:
    counts: dict[str, Counter] = defaultdict(Counter)
    for line in lines:
        kind = line.kind.split(":")[0]
        counts[line.topic]["lines"] += 1
        counts[line.topic][kind] += 1
        if kind == "corrupt":
            counts[line.topic][line.kind] += 1
    for event in events:
        if event.late:
            counts[event.topic]["late"] += 1
    result = {}
    for topic, counter in sorted(counts.items()):
        result[topic] = {
            "lines": counter["lines"],
            "valid": counter["valid"],
            "duplicate": counter["duplicate"],
            "corrupt": counter["corrupt"],
            "late": counter["late"],
            "corrupt_by_kind": {
                key.split(":")[1]: value for key, value in sorted(counter.items()) if ":" in key
            },
        }
    return result


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def write_truth(
    folder: Path,
    events: list[Event],
    lines: list[Line],
    join_window: timedelta,
    parameters: dict,
    files: dict[str, int],
    temperature_limit: float = 80.0,
    velocity_limit: int = 5,
) -> dict:
    """Write ledger.json, the expected views and the late event list; return the ledger."""
    folder.mkdir(parents=True, exist_ok=True)
    by_topic: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        by_topic[event.topic].append(event)
    revenue = revenue_by_category_5m(by_topic["orders"])
    payments = order_payments(by_topic["orders"], by_topic["payments"], join_window)
    _write_csv(folder / "revenue_by_category_5m.csv", REVENUE_COLUMNS, revenue)
    _write_csv(folder / "order_payments.csv", ORDER_PAYMENT_COLUMNS, payments)
    traffic = traffic_by_page_10m(by_topic["clicks"])
    health = device_health_5m(by_topic["sensors"])
    _write_csv(folder / "traffic_by_page_10m.csv", TRAFFIC_COLUMNS, traffic)
    _write_csv(folder / "device_health_5m.csv", DEVICE_COLUMNS, health)
    on_time = [e for e in events if not e.late]
    clicks_on_time = [e for e in on_time if e.topic == "clicks"]
    sessions = in_layers(user_sessions(by_topic["clicks"]), user_sessions(clicks_on_time), ("user_id", "session_start"))
    _write_csv(folder / "user_sessions.csv", SESSION_COLUMNS, sessions)
    raised = in_layers(
        alerts(by_topic["sensors"], by_topic["orders"], temperature_limit, velocity_limit),
        alerts([e for e in on_time if e.topic == "sensors"], [e for e in on_time if e.topic == "orders"],
               temperature_limit, velocity_limit),
        ("alert_id",),
    )
    _write_csv(folder / "alerts.csv", ALERT_COLUMNS, raised)
    versions = customer_versions(by_topic["customers_cdc"])
    dimension, history = customers(versions), customers_history(versions)
    enriched = order_segments(by_topic["orders"], versions)
    by_segment = revenue_by_segment_1h(enriched)
    _write_csv(folder / "customers.csv", CUSTOMER_COLUMNS, dimension)
    _write_csv(folder / "customers_history.csv", CUSTOMER_HISTORY_COLUMNS, history)
    _write_csv(folder / "order_segments.csv", ORDER_SEGMENT_COLUMNS, enriched)
    _write_csv(folder / "revenue_by_segment_1h.csv", SEGMENT_COLUMNS, by_segment)
    moved = [o for o in enriched if not o["late"] and o["segment_at_order"] != o["segment_at_end"]]
    late = sorted((e for e in events if e.late), key=lambda e: (e.topic, e.event_time, e.event_id))
    _write_csv(
        folder / "late_events.csv",
        ("topic", "event_id", "event_time", "arrived_at"),
        [
            {"topic": e.topic, "event_id": e.event_id, "event_time": iso_utc(e.event_time),
             "arrived_at": iso_utc(e.arrival)}
            for e in late
        ],
    )
    status = Counter(row["status"] for row in payments)
    ledger = {
        "parameters": parameters,
        "topics": topic_counts(events, lines),
        "files": files,
        "order_payments": {
            "orders": len(payments),
            "paid": status["paid"],
            "unpaid": status["unpaid"],
            "late_paid": sum(row["late_paid"] for row in payments),
        },
        "revenue_by_category_5m": {
            "rows": len(revenue),
            "revenue": round(sum(row["revenue"] for row in revenue), 2),
            "orders": sum(row["orders"] for row in revenue),
        },
        "traffic_by_page_10m": {
            "rows": len(traffic),
            "views": sum(row["views"] for row in traffic),
            "clicks": sum(row["clicks"] for row in traffic),
            "add_to_cart": sum(row["add_to_cart"] for row in traffic),
        },
        "user_sessions": {
            "rows": sum(row["in_batch"] for row in sessions),
            "events": sum(row["events"] for row in sessions if row["in_batch"]),
            "converted": sum(row["converted"] for row in sessions if row["in_batch"]),
        },
        "alerts": {
            kind: sum(row["in_batch"] for row in raised if row["kind"] == kind)
            for kind in ("high_temperature", "temperature_anomaly", "order_velocity")
        } | {"missed_by_stream": sum(row["in_batch"] and not row["in_stream"] for row in raised)},
        "customers": {
            "rows": len(dimension),
            "deleted": sum(changes[-1]["op"] == "d" for changes in versions.values()),
            "segment_changes": sum(a["image"]["segment"] != b["image"]["segment"] and "d" not in (a["op"], b["op"])
                                   for changes in versions.values() for a, b in zip(changes, changes[1:])),
            "recreated": sum(a["op"] == "d" and b["op"] != "d"
                             for changes in versions.values() for a, b in zip(changes, changes[1:])),
            "out_of_order": sum(
                later.arrival < earlier.arrival
                for changes in _by_customer(by_topic["customers_cdc"]).values()
                for earlier, later in zip(changes, changes[1:])),
        },
        "customers_history": {"rows": len(history), "current": sum(row["is_current"] for row in history)},
        "revenue_by_segment_1h": {
            "rows": len(by_segment),
            "revenue": round(sum(row["revenue"] for row in by_segment), 2),
            "orders": sum(row["orders"] for row in by_segment),
            "unknown_orders": sum(o["segment_at_order"] == UNKNOWN_SEGMENT for o in enriched),
            # On-time orders one --available-now run enriches differently from the point-in-time batch.
            "enriched_differently_at_end": len(moved),
            "revenue_moved_at_end": round(sum(o["amount"] for o in moved), 2),
        },
        "device_health_5m": {
            "rows": len(health),
            "readings": sum(row["readings"] for row in health),
            "max_temperature": max((row["max_temperature"] for row in health), default=None),
        },
    }
    (folder / "ledger.json").write_text(json.dumps(ledger, indent=2) + "\n", encoding="utf-8")
    return ledger
