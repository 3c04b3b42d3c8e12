"""Synthetic e-commerce and IoT traffic: what happened (event time) and when it landed (arrival).

Users browse in sessions (clicks), add to cart and order; payments follow orders after a delay;
customers change through Debezium-style CDC events; devices report sensor readings. On top of the
valid traffic the simulator injects late arrivals, duplicates and corrupt lines at chosen rates.
Everything is drawn from one ``random.Random(seed)``, so a seed reproduces the same traffic.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

CATEGORIES = {
    "electronics": (40.0, 900.0),
    "books": (5.0, 60.0),
    "fashion": (15.0, 250.0),
    "home": (10.0, 400.0),
    "sports": (10.0, 300.0),
    "toys": (5.0, 120.0),
    "beauty": (5.0, 90.0),
    "grocery": (2.0, 40.0),
}
DEVICES = ("mobile", "desktop", "tablet")
PAYMENT_METHODS = ("card", "paypal", "bank_transfer", "apple_pay")
SEGMENTS = ("consumer", "premium", "business")
COUNTRIES = ("DE", "FR", "NL", "ES", "IT", "PL", "SE", "US", "GB")
FIRST_NAMES = ("Ada", "Alan", "Grace", "Linus", "Edsger", "Barbara", "Ken", "Margaret", "Donald", "Frances")
LAST_NAMES = (
    "Lovelace", "Turing", "Hopper", "Torvalds", "Dijkstra", "Liskov", "Thompson", "Hamilton", "Knuth", "Allen"
)
CORRUPT_KINDS = ("invalid_json", "missing_field", "wrong_type", "bad_timestamp")

# How payments follow orders (event time): the share of orders and the delay range in minutes.
PAYMENT_DELAYS = (
    ("quick", 0.80, (0.2, 10.0)),  # most pay within minutes
    ("slow", 0.10, (12.0, 55.0)),  # inside the 1 h join window, beyond the watermark delay
    ("too_late", 0.04, (65.0, 180.0)),  # after the join window: the order stays unpaid
    ("never", 0.06, None),
)
SESSION_CONVERSION = 0.25
# Planted for the user_sessions view: a share of visits is followed by the same user's return
# after one of these pauses (last click to first click), on both sides of the 30-minute gap.
RETURN_VISIT_SHARE = 0.2
RETURN_PAUSES = (timedelta(minutes=20), timedelta(minutes=30), timedelta(minutes=30, milliseconds=1),
                 timedelta(minutes=31), timedelta(minutes=45))
# Planted for the alerts view, per sensor reading: a spike far above the device's usual
# temperature but below the 80 °C limit (an anomaly), and an overheating above the limit.
ANOMALY_SHARE, ANOMALY_RISE = 0.005, (25.0, 40.0)
OVERHEAT_SHARE, OVERHEAT_RANGE = 0.001, (81.0, 95.0)
# Order bursts (order_velocity): per 100 orders an hour, one user places this many orders
# within a few minutes (more than the default limit of 5 in a 5-minute window, unless the
# burst straddles a window boundary).
BURSTS_PER_100_ORDERS, BURST_ORDERS, BURST_MINUTES = 1.0, (6, 8), 4.0
# Customer CDC (customers, customers_history, revenue_by_segment_1h): per hour this share of the
# customers changes; of the changes, creates (some re-creating a deleted customer) and deletes,
# the rest a segment change followed 20 s later by an e-mail change, the older one landing after
# the newer one in a share of pairs. Customers order before and after their changes; some
# visitors check out as guests, unknown to the dimension.
CUSTOMER_CHANGES_PER_HOUR = 0.01
CREATE_SHARE, RECREATE_SHARE, DELETE_SHARE = 0.15, 0.2, 0.05
OUT_OF_ORDER_SHARE = 0.3
GUEST_SHARE = 0.03
# How much later than ``late_beyond`` past the watermark delay a late event lands.
LATE_MARGIN_MINUTES = (1.0, 30.0)


def iso_utc(moment: datetime) -> str:
    """``2026-11-20T10:00:00.123Z`` (isoformat: strftime took a sixth of a demo day's generation)."""
    if moment.tzinfo is not timezone.utc:
        moment = moment.astimezone(timezone.utc)
    return moment.isoformat(timespec="milliseconds")[:-6] + "Z"


def iso_with_offset(moment: datetime, offset_hours: int) -> str:
    local = moment.astimezone(timezone(timedelta(hours=offset_hours)))
    return local.isoformat(timespec="milliseconds")


@dataclass(slots=True)
class Event:
    """One valid event: its identity, times and JSON payload."""

    topic: str
    event_id: str
    event_time: datetime
    arrival: datetime
    payload: dict
    late: bool = False

    def __post_init__(self) -> None:
        # Payload times carry milliseconds; keep the truth at the same precision.
        self.event_time = self.event_time.replace(microsecond=self.event_time.microsecond // 1000 * 1000)


@dataclass(slots=True)
class Line:
    """One landed line; ``kind`` is ``valid``, ``duplicate`` or ``corrupt:<reason kind>``."""

    topic: str
    arrival: datetime
    text: str
    kind: str


@dataclass(frozen=True)
class TrafficOptions:
    orders_per_hour: float = 200.0
    late_fraction: float = 0.02
    duplicate_fraction: float = 0.01
    corrupt_fraction: float = 0.005
    customers: int = 500
    devices: int = 20
    sensor_interval_seconds: int = 60
    watermark_delay: timedelta = timedelta(minutes=10)
    # A late event lands more than this past the watermark delay: at least the arrival time one
    # stream micro-batch spans (one 15-minute landing file), so the watermark has surely passed it.
    late_beyond: timedelta = timedelta(minutes=15)

    def __post_init__(self) -> None:
        for name in ("late_fraction", "duplicate_fraction", "corrupt_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 0.5:
                raise ValueError(f"{name.replace('_', ' ')} must be between 0 and 0.5, got {value}")
        if self.orders_per_hour <= 0:
            raise ValueError(f"orders per hour must be positive, got {self.orders_per_hour}")
        if self.customers < 1 or self.devices < 1:
            raise ValueError("customers and devices must be at least 1")
        if self.sensor_interval_seconds < 1:
            raise ValueError(f"sensor interval must be >= 1 s, got {self.sensor_interval_seconds}")


@dataclass
class Simulator:
    """Stateful traffic simulator; :meth:`simulate` produces one span of event time at a time."""

    options: TrafficOptions
    seed: int
    rng: random.Random = field(init=False)
    products: list[tuple[str, str, float]] = field(init=False)
    customers: dict[str, dict] = field(init=False, default_factory=dict)
    deleted: list[str] = field(init=False, default_factory=list)
    next_customer: int = field(init=False, default=1)
    _ids: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        categories = sorted(CATEGORIES)
        self.products = []
        for number in range(1, 201):
            category = categories[number % len(categories)]
            low, high = CATEGORIES[category]
            self.products.append((f"P{number:04d}", category, round(self.rng.uniform(low, high), 2)))

    # ---- helpers ------------------------------------------------------------------------
    def _id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self.rng.getrandbits(40):010x}{self._ids:07d}"

    def _arrival(self, event_time: datetime) -> datetime:
        return event_time + timedelta(seconds=min(self.rng.expovariate(1 / 2.0), 30.0))

    def _time_text(self, moment: datetime) -> str:
        # A few producers send local offsets; the platform must normalise them to UTC.
        if self.rng.random() < 0.05:
            return iso_with_offset(moment, self.rng.choice((-5, 1, 2, 9)))
        return iso_utc(moment)

    def _count(self, expected: float) -> int:
        """An integer count whose mean is ``expected``."""
        return int(expected) + (self.rng.random() < expected % 1)

    def _uniform_time(self, start: datetime, end: datetime) -> datetime:
        span = (end - start).total_seconds()
        return start + timedelta(milliseconds=int(self.rng.uniform(0, span) * 1000))

    # ---- topics -------------------------------------------------------------------------
    def _customer_row(self, customer_id: str) -> dict:
        first, last = self.rng.choice(FIRST_NAMES), self.rng.choice(LAST_NAMES)
        return {
            "customer_id": customer_id,
            "name": f"{first} {last}",
            "email": f"{first}.{last}.{customer_id}@example.com".lower(),
            "segment": self.rng.choice(SEGMENTS),
            "country": self.rng.choice(COUNTRIES),
        }

    def _cdc(self, op: str, moment: datetime, before: dict | None, after: dict | None) -> Event:
        ts_ms = int(moment.timestamp() * 1000)
        customer_id = (after or before)["customer_id"]
        payload = {"op": op, "ts_ms": ts_ms, "before": before, "after": after, "source": "crm"}
        return Event("customers_cdc", f"{customer_id}|{ts_ms}", moment, self._arrival(moment), payload)

    def _customer_events(self, start: datetime, end: datetime) -> list[Event]:
        events = []
        if not self.customers:  # initial snapshot, as Debezium emits 'r' reads
            for _ in range(self.options.customers):
                customer_id = f"C{self.next_customer:05d}"
                self.next_customer += 1
                self.customers[customer_id] = self._customer_row(customer_id)
                moment = start + timedelta(milliseconds=self.next_customer)
                events.append(self._cdc("r", moment, None, self.customers[customer_id]))
        hours = (end - start).total_seconds() / 3600
        for _ in range(self._count(hours * self.options.customers * CUSTOMER_CHANGES_PER_HOUR)):
            moment = self._uniform_time(start, end)
            roll = self.rng.random()
            if roll < CREATE_SHARE or not self.customers:
                if self.deleted and self.rng.random() < RECREATE_SHARE:
                    customer_id = self.deleted.pop(self.rng.randrange(len(self.deleted)))
                else:
                    customer_id = f"C{self.next_customer:05d}"
                    self.next_customer += 1
                self.customers[customer_id] = self._customer_row(customer_id)
                events.append(self._cdc("c", moment, None, self.customers[customer_id]))
            elif roll < CREATE_SHARE + DELETE_SHARE:
                customer_id = self.rng.choice(sorted(self.customers))
                self.deleted.append(customer_id)
                events.append(self._cdc("d", moment, self.customers.pop(customer_id), None))
            else:
                customer_id = self.rng.choice(sorted(self.customers))
                before = self.customers[customer_id]
                first = {**before, "segment": self.rng.choice([s for s in SEGMENTS if s != before["segment"]])}
                second = {**first, "email": f"new.{customer_id}.{self.rng.randint(1, 999)}@example.com".lower()}
                update_1 = self._cdc("u", moment, before, first)
                update_2 = self._cdc("u", moment + timedelta(seconds=20), first, second)
                if self.rng.random() < OUT_OF_ORDER_SHARE:  # the older change lands after the newer one
                    update_1.arrival = update_2.arrival + timedelta(seconds=self.rng.uniform(1, 60))
                self.customers[customer_id] = second
                events += [update_1, update_2]
        return events

    def _session_events(self, start: datetime, end: datetime) -> list[Event]:
        hours = (end - start).total_seconds() / 3600
        # Orders per hour as asked, counting the return visits' orders and the bursts'.
        burst_share = BURSTS_PER_100_ORDERS * sum(BURST_ORDERS) / 2 / 100
        visit_orders = self.options.orders_per_hour * hours * (1 - burst_share)
        sessions = self._count(visit_orders / SESSION_CONVERSION / (1 + RETURN_VISIT_SHARE))
        user_ids = sorted(self.customers) or ["C00001"]
        events: list[Event] = []
        for _ in range(sessions):
            user_id = (f"G{self.rng.randrange(10_000):04d}" if self.rng.random() < GUEST_SHARE
                       else self.rng.choice(user_ids))
            visit = self._visit(user_id, self._uniform_time(start, end))
            events += visit
            if self.rng.random() < RETURN_VISIT_SHARE:
                last_click = max(e.event_time for e in visit if e.topic == "clicks")
                events += self._visit(user_id, last_click + self.rng.choice(RETURN_PAUSES))
        return events

    def _visit(self, user_id: str, first_click: datetime) -> list[Event]:
        """One visit: pages, a product, maybe the cart and an order; the first click at ``first_click``."""
        session_id = self._id("s")
        device = self.rng.choice(DEVICES)
        converts = self.rng.random() < SESSION_CONVERSION
        product_id, category, price = self.rng.choice(self.products)
        pages = ["/home"] + [
            self.rng.choice((f"/category/{self.rng.choice(sorted(CATEGORIES))}",
                             f"/search?q=item{self.rng.randint(1, 99)}"))
            for _ in range(self.rng.randint(0, 3))
        ]
        steps = [(page, "view", None) for page in pages]
        steps.append((f"/product/{product_id}", "view", product_id))
        steps.append((f"/product/{product_id}", "click", product_id))
        if converts:
            steps.append((f"/product/{product_id}", "add_to_cart", product_id))
        events: list[Event] = []
        moment = first_click
        for page, action, product in steps:
            payload = {
                "event_id": self._id("e"), "user_id": user_id, "session_id": session_id,
                "page_url": page, "action": action, "device_type": device,
                "event_time": self._time_text(moment),
            }
            if product is not None:
                payload["product_id"] = product
            events.append(Event("clicks", payload["event_id"], moment, self._arrival(moment), payload))
            moment = events[-1].event_time + timedelta(seconds=self.rng.uniform(3, 60))
        if converts:
            moment += timedelta(seconds=self.rng.uniform(10, 120))
            events += self._order_and_payment(moment, user_id, product_id, category, price)
        return events

    def _order_bursts(self, start: datetime, end: datetime) -> list[Event]:
        hours = (end - start).total_seconds() / 3600
        bursts = self._count(hours * self.options.orders_per_hour / 100 * BURSTS_PER_100_ORDERS)
        user_ids = sorted(self.customers) or ["C00001"]
        events: list[Event] = []
        for _ in range(bursts):
            user_id, first = self.rng.choice(user_ids), self._uniform_time(start, end)
            for _ in range(self.rng.randint(*BURST_ORDERS)):
                moment = first + timedelta(seconds=self.rng.uniform(0, BURST_MINUTES * 60))
                product_id, category, price = self.rng.choice(self.products)
                events += self._order_and_payment(moment, user_id, product_id, category, price)
        return events

    def _order_and_payment(
        self, moment: datetime, user_id: str, product_id: str, category: str, price: float
    ) -> list[Event]:
        amount = round(price * self.rng.choice((1, 1, 1, 2, 3)), 2)
        order = {
            "order_id": self._id("o"), "user_id": user_id, "product_id": product_id,
            "category": category, "amount": amount, "event_time": self._time_text(moment),
        }
        events = [Event("orders", order["order_id"], moment, self._arrival(moment), order)]
        roll, threshold = self.rng.random(), 0.0
        for _name, share, delay in PAYMENT_DELAYS:
            threshold += share
            if roll < threshold:
                break
        if delay is not None:
            paid_at = moment + timedelta(minutes=self.rng.uniform(*delay))
            payment = {
                "payment_id": self._id("p"), "order_id": order["order_id"], "amount": amount,
                "method": self.rng.choice(PAYMENT_METHODS), "event_time": self._time_text(paid_at),
            }
            events.append(Event("payments", payment["payment_id"], paid_at, self._arrival(paid_at), payment))
        return events

    def _sensor_events(self, start: datetime, end: datetime) -> list[Event]:
        interval = self.options.sensor_interval_seconds
        first_tick = int(start.timestamp()) // interval * interval
        if first_tick < start.timestamp():
            first_tick += interval
        events = []
        for tick in range(first_tick, int(end.timestamp()), interval):
            for number in range(1, self.options.devices + 1):
                device_id = f"D{number:04d}"
                moment = datetime.fromtimestamp(tick, timezone.utc) + timedelta(
                    milliseconds=number * 37 % 1000
                )
                temperature = 18 + number % 7 + self.rng.gauss(0, 0.8)
                roll = self.rng.random()
                if roll < ANOMALY_SHARE:
                    temperature += self.rng.uniform(*ANOMALY_RISE)
                elif roll < ANOMALY_SHARE + OVERHEAT_SHARE:
                    temperature = self.rng.uniform(*OVERHEAT_RANGE)
                payload = {
                    "device_id": device_id, "temperature": round(temperature, 2),
                    "humidity": round(min(max(self.rng.gauss(45, 6), 5), 95), 2),
                    "event_time": self._time_text(moment),
                }
                events.append(
                    Event("sensors", f"{device_id}|{iso_utc(moment)}", moment, self._arrival(moment), payload)
                )
        return events

    # ---- faults -------------------------------------------------------------------------
    def _make_late(self, events: list[Event], horizon: datetime) -> None:
        """Delay a share of events past the watermark. Only events followed by enough traffic
        qualify, so the stream's watermark really has passed them when they land."""
        delay = self.options.watermark_delay + self.options.late_beyond
        longest = delay + timedelta(minutes=LATE_MARGIN_MINUTES[1]) + timedelta(minutes=5)
        for event in events:
            if event.event_time + longest < horizon and self.rng.random() < self.options.late_fraction:
                extra = timedelta(minutes=self.rng.uniform(*LATE_MARGIN_MINUTES))
                event.arrival = event.event_time + delay + extra
                event.late = True

    def _corrupt_line(self, event: Event) -> tuple[str, str]:
        kind = self.rng.choice(CORRUPT_KINDS)
        payload = dict(event.payload)
        if event.topic == "customers_cdc" and kind == "bad_timestamp":
            kind = "wrong_type"
        if kind == "invalid_json":
            text = json.dumps(payload)
            return kind, text[: self.rng.randint(1, len(text) - 2)]
        if kind == "missing_field":
            required = [key for key in payload if key not in ("product_id", "before", "after", "source")]
            del payload[self.rng.choice(required)]
        elif kind == "wrong_type":
            wrong = {
                "clicks": ("user_id", 12345),
                "orders": ("amount", "12.50 EUR"),
                "payments": ("amount", "unknown"),
                "customers_cdc": ("ts_ms", "yesterday"),
                "sensors": ("temperature", "hot"),
            }
            key, value = wrong[event.topic]
            payload[key] = value
        else:
            payload["event_time"] = self.rng.choice(
                ("2026-13-45T99:00:00Z", "yesterday noon", "20/11/2026 10:00", "")
            )
        return kind, json.dumps(payload)

    def lines(self, start: datetime, end: datetime, horizon: datetime | None = None) -> tuple[list[Event], list[Line]]:
        """Simulate event time ``[start, end)``. Returns the valid events and every landed line.

        ``horizon`` is the last moment traffic continues (default ``end``); events late past
        the watermark are chosen only where the stream keeps flowing after them.
        """
        if start.tzinfo is None or end.tzinfo is None:
            raise ValueError("start and end must carry a time zone")
        if end <= start:
            raise ValueError("end must be after start")
        events = (self._customer_events(start, end) + self._session_events(start, end) + self._order_bursts(start, end)
                  + self._sensor_events(start, end))
        self._make_late(events, horizon or end)
        lines = [Line(e.topic, e.arrival, json.dumps(e.payload), "valid") for e in events]
        for event in events:
            if not event.late and self.rng.random() < self.options.duplicate_fraction:
                again = event.arrival + timedelta(seconds=self.rng.uniform(1, 180))
                lines.append(Line(event.topic, again, json.dumps(event.payload), "duplicate"))
            if self.rng.random() < self.options.corrupt_fraction:
                kind, text = self._corrupt_line(event)
                lines.append(Line(event.topic, event.arrival, text, f"corrupt:{kind}"))
        return events, lines
