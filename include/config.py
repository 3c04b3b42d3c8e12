"""One typed settings object for the whole platform.

Values come from keyword overrides (the CLI's ``--home``), then ``LAMBDALAKE_*`` environment
variables, then the defaults below. Invalid values fail at start-up with a one-line
:class:`ConfigError` that names the setting.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from include.spark_jars import default_jars_dir

ENV_PREFIX = "LAMBDALAKE_"

_DURATION = re.compile(
    r"^\s*(?P<amount>-?\d+(?:\.\d+)?)\s*"
    r"(?P<unit>ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?|d|days?)?\s*$",
    re.IGNORECASE,
)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


class ConfigError(ValueError):
    """A setting has an invalid value; the message is one line naming the setting."""


def parse_duration(value: Any, what: str) -> timedelta:
    """Parse ``'10 minutes'``, ``'90s'``, ``'1h'``, a number of seconds or a timedelta.

    Raises ValueError (with ``what`` in the message) unless the duration is positive.
    """
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        duration = timedelta(seconds=value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{what} must be a duration like '10 minutes', got '{value}'")
        unit = (match["unit"] or "s").lower()
        key = "ms" if unit.startswith("ms") or unit.startswith("milli") else unit[0]
        duration = timedelta(seconds=float(match["amount"]) * _UNIT_SECONDS[key])
    if duration <= timedelta(0):
        raise ValueError(f"{what} must be positive, got '{value}'")
    return duration


def _view_intervals(text: str) -> dict[str, timedelta]:
    intervals = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, duration = (part.strip() for part in item.partition("="))
        if not equals or not name:
            raise ValueError(f"view triggers must look like 'VIEW=DURATION,...', got '{item}'")
        intervals[name] = parse_duration(duration, f"the trigger interval of '{name}'")
    return intervals


def spark_interval(duration: timedelta) -> str:
    """A Spark interval string (``'600 seconds'``) for watermarks and window lengths."""
    return f"{int(duration.total_seconds())} seconds"


class Settings(BaseSettings):
    """Platform configuration, environment prefix ``LAMBDALAKE_``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    home: Path = Field(default=Path.home() / ".lambdalake", description="root of all data")
    watermark_delay: timedelta = Field(default=timedelta(minutes=10))
    join_window: timedelta = Field(default=timedelta(hours=1))
    spark_master: str = "local[*]"
    spark_ui: bool = False
    spark_driver_memory: str = "4g"
    shuffle_partitions: int = Field(default=4, ge=1)
    # The stream's queries' shuffle (and state) partitions, fixed in a query's checkpoint when it
    # first starts. Unset: the task slots on one machine, shuffle_partitions on a cluster.
    stream_shuffle_partitions: int | None = Field(default=None, ge=1)
    # All streaming state's memory on one executor (RocksDB's block cache and write buffers, shared
    # by every stateful query; the rest stays on disk), so it does not grow with the state.
    state_memory_mb: int = Field(default=512, ge=64)
    # Where `make install` fetched the Spark packages of include/spark_jars.py (Delta, the Kafka
    # connector); every session puts what it holds on spark.jars.
    spark_jars_dir: Path = Field(default_factory=default_jars_dir, description="the fetched Spark packages")
    # Comma-separated local jar paths / Maven coordinates, besides those.
    spark_jars: str = ""
    spark_jars_packages: str = ""
    commit_retries: int = Field(default=8, ge=0, description="retries of a conflicting Delta commit")
    commit_backoff_seconds: float = Field(default=0.1, gt=0)
    # Speed layer.
    event_source: Literal["landing", "kafka", "rate"] = "landing"
    # Landing files per topic per micro-batch. Unset: a continuous stream takes every file waiting,
    # up to max_bytes_per_trigger (so it catches up after a slow spell), and `--available-now`
    # takes one, so its watermarks advance between micro-batches as a live stream's would.
    max_files_per_trigger: int | None = Field(default=None, ge=1)
    # Bytes per topic per micro-batch of a continuous stream (at least one file): what bounds the
    # memory of a micro-batch after an outage. Kafka's bound in records is derived from it.
    max_bytes_per_trigger: int = Field(default=64 * 1024 * 1024, ge=1024)
    # Spark's file source ignores a landing file this much older (by mtime) than the newest it
    # has seen (its own default is 7 days, which silently drops a backfill moved in with `mv`).
    landing_max_file_age: timedelta = Field(default=timedelta(days=3650))
    # Comma-separated; the views left out are served from the batch layer alone (docs/speed-layer.md).
    speed_views: str = Field(default="", description="views the speed layer maintains (empty: all)")
    # How often the stream compacts the small files of the tables it appends to (0: never; the
    # daily maintenance does all tables): speed_layer/compaction.py.
    stream_compaction_interval: timedelta = Field(default=timedelta(minutes=10), ge=timedelta(0))
    # Kafka records per topic per micro-batch (unset: max_bytes_per_trigger / KAFKA_RECORD_BYTES).
    max_offsets_per_trigger: int | None = Field(default=None, ge=1)
    # Ingest's and the seconds-fresh views' micro-batch interval: a landed file is picked up within
    # a second (an idle query only asks its source for new data).
    trigger_interval: timedelta = Field(default=timedelta(seconds=1))
    # Comma-separated VIEW=DURATION: a speed view's own micro-batch interval (else the above, or
    # its spec's refresh if longer: 30 s for the views that need not be fresh to the second).
    view_triggers: str = Field(default="", description="e.g. 'user_sessions=30s,traffic_by_page_10m=1m'")
    # Bronze's own micro-batch interval (else 10 s, or the above if longer): no speed view waits
    # for Bronze, so a longer one leaves the cores to ingest and the views.
    bronze_trigger_interval: timedelta | None = None
    kafka_bootstrap_servers: str = "localhost:9092"
    kafka_partitions: int = Field(default=3, ge=1, description="partitions of a topic the generator creates")
    rate_rows_per_second: int = Field(default=1000, ge=1)
    max_line_bytes: int = Field(default=1024 * 1024, ge=64)
    # A copy of an event (same id) ingested within this long after the first is a duplicate.
    # Spark keeps each id about this long and scans all it keeps every micro-batch: the state
    # grows with the event rate times this window.
    dedup_window: timedelta = Field(default=timedelta(minutes=5))
    # Precision of the speed layer's distinct counts (HLL sketches): a sketch grows about 4x for
    # each halving (0.02: 2^12 buckets, at most ~2 KB per window and key; exact for few values).
    approx_distinct_rsd: float = Field(default=0.02, ge=0.005, le=0.3, description="relative standard deviation")
    # Alert rules (the alerts view).
    temperature_limit: float = Field(default=80.0, description="high_temperature: a reading above this")
    velocity_limit: int = Field(
        default=5, ge=1, description="order_velocity: more orders than this per user in 5 minutes"
    )
    # Orchestration.
    batch_start_date: date = Field(default=date(2026, 11, 1), description="first day the nightly DAG runs for")
    alert_webhook_url: str = ""
    # Alerts by e-mail, through the Airflow connection `lambdalake_smtp` when it is defined.
    alert_email_to: str = Field(default="", description="comma-separated recipients")
    alert_email_from: str = Field(default="", description="sender (else the connection's from_email)")
    # lakehouse_maintenance alerts on what `lambdalake doctor` finds; with this it also carries out
    # the repairs `--repair` makes safely (checkpoint files only while no stream runs).
    maintenance_repairs: bool = Field(default=False, description="lakehouse_maintenance repairs what doctor may")
    stall_after: timedelta = Field(default=timedelta(minutes=10))
    restart_backoff: timedelta = Field(default=timedelta(minutes=1))
    max_restarts_per_hour: int = Field(default=5, ge=1)
    freshness_sla: timedelta = Field(default=timedelta(minutes=30))
    # What the command line shows: at WARNING (the default) Spark's JVM output goes to
    # run/spark.log instead of the terminal; INFO (--verbose) or DEBUG shows it.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    # Serving.
    serve_token: SecretStr = Field(
        default=SecretStr(""), description="bearer token of `lambdalake serve` (else generated)"
    )
    query_timeout: timedelta = Field(default=timedelta(seconds=30), description="a serving query is cancelled past it")
    # What one query may cost the server (HTTP and the PostgreSQL protocol alike): rows past the cap
    # are left out and the answer says so; queries past the limit wait for a slot (503 / SQLSTATE
    # 53000 after the query time limit), so /api/status and the dashboard keep answering.
    max_result_rows: int = Field(default=100_000, ge=1, description="rows a serving query answers at most")
    max_concurrent_queries: int = Field(default=4, ge=1, description="serving queries running at once")
    # The PostgreSQL wire protocol of `lambdalake serve` (0: off); 5433, not 5432, leaves a local
    # PostgreSQL its port.
    pg_port: int = Field(default=5433, ge=0, le=65535, description="`lambdalake serve` PostgreSQL port (0: off)")
    # The address every service of the embedded platform (`make up`) listens on: Airflow's API
    # server, `lambdalake serve` (HTTP and PostgreSQL) and the Spark drivers Airflow starts.
    # Loopback by default; 0.0.0.0 opens them to the network.
    bind_host: str = Field(default="127.0.0.1", description="address `make up`'s services listen on")
    # GET /metrics needs the token unless this is set; then clients on this machine (127.0.0.1, ::1)
    # scrape it without one.
    metrics_open_on_localhost: bool = False
    max_reconciliation_drift: float = Field(default=0.5, gt=0, description="share of a batch metric")

    @field_validator("watermark_delay", mode="before")
    @classmethod
    def _watermark_delay(cls, value: Any) -> timedelta:
        return parse_duration(value, "watermark delay")

    @field_validator("join_window", mode="before")
    @classmethod
    def _join_window(cls, value: Any) -> timedelta:
        return parse_duration(value, "join window")

    @field_validator("trigger_interval", mode="before")
    @classmethod
    def _trigger_interval(cls, value: Any) -> timedelta:
        return parse_duration(value, "trigger interval")

    @field_validator("stream_shuffle_partitions", "max_files_per_trigger", "max_offsets_per_trigger", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value  # an empty variable: the default

    @field_validator("bronze_trigger_interval", mode="before")
    @classmethod
    def _bronze_trigger_interval(cls, value: Any) -> timedelta | None:
        return None if value in (None, "") else parse_duration(value, "Bronze trigger interval")

    @field_validator("view_triggers")
    @classmethod
    def _view_triggers(cls, value: str) -> str:
        _view_intervals(value)
        return value

    @property
    def view_trigger_intervals(self) -> dict[str, timedelta]:
        """``view_triggers`` by view name (the names are checked against the registry in
        :func:`include.views.speed_trigger_intervals`)."""
        return _view_intervals(self.view_triggers)

    @field_validator("stall_after", "restart_backoff", "freshness_sla", "dedup_window", "query_timeout",
                     "landing_max_file_age", mode="before")
    @classmethod
    def _durations(cls, value: Any, info: Any) -> timedelta:
        return parse_duration(value, info.field_name.replace("_", " "))

    @field_validator("bind_host")
    @classmethod
    def _bind_host(cls, value: str) -> str:
        if not re.fullmatch(r"[\w.:-]+", value.strip()):
            raise ValueError(f"bind host must be an address or a host name, got '{value}'")
        return value.strip()

    @field_validator("spark_driver_memory")
    @classmethod
    def _driver_memory(cls, value: str) -> str:
        if not re.fullmatch(r"\d+[kmgt]?", value.strip().lower()):
            raise ValueError(f"spark driver memory must look like '4g', got '{value}'")
        return value.strip().lower()

    @field_validator("home", mode="after")
    @classmethod
    def _home(cls, value: Path) -> Path:
        home = value.expanduser().absolute()
        if home.exists() and not home.is_dir():
            raise ValueError(f"home must be a directory, got file '{home}'")
        return home

    @property
    def landing_dir(self) -> Path:
        return self.home / "landing"

    @property
    def lakehouse_dir(self) -> Path:
        return self.home / "lakehouse"

    @property
    def checkpoints_dir(self) -> Path:
        return self.home / "checkpoints"

    @property
    def truth_dir(self) -> Path:
        return self.home / "truth"

    @property
    def feeds_dir(self) -> Path:
        """On-time, deduplicated events handed from ingest to the streaming Gold queries."""
        return self.home / "feeds"

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def run_dir(self) -> Path:
        """Process state: heartbeat, pid files."""
        return self.home / "run"

    def landing_topic_dir(self, topic: str) -> Path:
        return self.landing_dir / topic


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning validation errors into a one-line :class:`ConfigError`.

    ``None`` overrides are ignored, so CLI options that were not given fall through to the
    environment and the defaults.
    """
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        message = error["msg"].removeprefix("Value error, ")
        value = error.get("input")
        source = f"{ENV_PREFIX}{field.upper()}"
        if error["type"] == "extra_forbidden":
            raise ConfigError(f"unknown setting '{field}'") from None
        raise ConfigError(f"invalid setting {source}={value!s}: {message}") from None
