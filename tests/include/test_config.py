from __future__ import annotations

from datetime import timedelta

import pytest

from include.config import ConfigError, load_settings, parse_duration, spark_interval


def test_defaults(settings):
    assert settings.watermark_delay == timedelta(minutes=10)
    assert settings.join_window == timedelta(hours=1)
    assert settings.spark_master == "local[2]"
    assert settings.landing_dir == settings.home / "landing"
    assert settings.truth_dir == settings.home / "truth"
    assert settings.checkpoints_dir.parent == settings.lakehouse_dir.parent == settings.home


def test_environment_is_read_and_home_override_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMBDALAKE_HOME", str(tmp_path / "from-env"))
    monkeypatch.setenv("LAMBDALAKE_WATERMARK_DELAY", "5 minutes")
    monkeypatch.setenv("LAMBDALAKE_JOIN_WINDOW", "2h")
    assert load_settings().home == tmp_path / "from-env"
    assert load_settings(home=tmp_path / "flag").home == tmp_path / "flag"
    assert load_settings().watermark_delay == timedelta(minutes=5)
    assert load_settings().join_window == timedelta(hours=2)


@pytest.mark.parametrize(
    ("env", "value", "expected"),
    [
        ("WATERMARK_DELAY", "-5 minutes",
         "invalid setting LAMBDALAKE_WATERMARK_DELAY=-5 minutes: watermark delay must be positive, got '-5 minutes'"),
        ("WATERMARK_DELAY", "soon",
         "invalid setting LAMBDALAKE_WATERMARK_DELAY=soon: watermark delay must be a duration like '10 minutes', "
         "got 'soon'"),
        ("JOIN_WINDOW", "0s", "invalid setting LAMBDALAKE_JOIN_WINDOW=0s: join window must be positive, got '0s'"),
        ("EVENT_SOURCE", "mqtt",
         "invalid setting LAMBDALAKE_EVENT_SOURCE=mqtt: Input should be 'landing', 'kafka' or 'rate'"),
        ("SHUFFLE_PARTITIONS", "0",
         "invalid setting LAMBDALAKE_SHUFFLE_PARTITIONS=0: Input should be greater than or equal to 1"),
        ("STREAM_SHUFFLE_PARTITIONS", "0",
         "invalid setting LAMBDALAKE_STREAM_SHUFFLE_PARTITIONS=0: Input should be greater than or equal to 1"),
        ("SPARK_DRIVER_MEMORY", "lots",
         "invalid setting LAMBDALAKE_SPARK_DRIVER_MEMORY=lots: spark driver memory must look like '4g', got 'lots'"),
        ("APPROX_DISTINCT_RSD", "0.001",
         "invalid setting LAMBDALAKE_APPROX_DISTINCT_RSD=0.001: Input should be greater than or equal to 0.005"),
        ("LANDING_MAX_FILE_AGE", "0d",
         "invalid setting LAMBDALAKE_LANDING_MAX_FILE_AGE=0d: landing max file age must be positive, got '0d'"),
        ("VIEW_TRIGGERS", "alerts:30s",
         "invalid setting LAMBDALAKE_VIEW_TRIGGERS=alerts:30s: view triggers must look like 'VIEW=DURATION,...', "
         "got 'alerts:30s'"),
        ("BRONZE_TRIGGER_INTERVAL", "0s",
         "invalid setting LAMBDALAKE_BRONZE_TRIGGER_INTERVAL=0s: Bronze trigger interval must be positive, got '0s'"),
        ("VIEW_TRIGGERS", "alerts=soon",
         "invalid setting LAMBDALAKE_VIEW_TRIGGERS=alerts=soon: the trigger interval of 'alerts' must be a duration "
         "like '10 minutes', got 'soon'"),
    ],
)
def test_bad_values_give_one_line_error_naming_the_setting(settings, monkeypatch, env, value, expected):
    monkeypatch.setenv(f"LAMBDALAKE_{env}", value)
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value) == expected
    assert "\n" not in str(error.value)


def test_stream_shuffle_partitions_from_the_environment(settings, monkeypatch):
    monkeypatch.setenv("LAMBDALAKE_STREAM_SHUFFLE_PARTITIONS", "")
    assert load_settings().stream_shuffle_partitions is None  # the default: one per task slot
    monkeypatch.setenv("LAMBDALAKE_STREAM_SHUFFLE_PARTITIONS", "3")
    assert load_settings().stream_shuffle_partitions == 3


def test_micro_batch_bounds_from_the_environment(settings, monkeypatch):
    assert (settings.max_files_per_trigger, settings.max_offsets_per_trigger) == (None, None)  # sized by what waits
    assert settings.max_bytes_per_trigger == 64 * 1024 * 1024
    monkeypatch.setenv("LAMBDALAKE_MAX_FILES_PER_TRIGGER", "")
    monkeypatch.setenv("LAMBDALAKE_MAX_BYTES_PER_TRIGGER", "1048576")
    assert (load_settings().max_files_per_trigger, load_settings().max_bytes_per_trigger) == (None, 1048576)
    monkeypatch.setenv("LAMBDALAKE_MAX_FILES_PER_TRIGGER", "0")
    with pytest.raises(ConfigError, match="LAMBDALAKE_MAX_FILES_PER_TRIGGER=0"):
        load_settings()


def test_home_that_is_a_file_is_rejected(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ConfigError, match="LAMBDALAKE_HOME=.*home must be a directory"):
        load_settings(home=target)


def test_unknown_setting_is_rejected():
    with pytest.raises(ConfigError, match="unknown setting 'watermark'"):
        load_settings(watermark="10 minutes")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10 minutes", 600), ("90s", 90), ("1h", 3600), ("1.5 hours", 5400), (30, 30), ("250 ms", 0.25)],
)
def test_durations(text, seconds):
    assert parse_duration(text, "x").total_seconds() == seconds


def test_spark_interval():
    assert spark_interval(timedelta(minutes=10)) == "600 seconds"


def test_view_triggers_give_some_views_their_own_interval(settings):
    from include.views import speed_trigger_intervals

    chosen = settings.model_copy(update={"trigger_interval": timedelta(seconds=2),
                                         "view_triggers": " revenue_by_segment_1h=1 minute,"})
    intervals = speed_trigger_intervals(chosen)
    assert intervals["revenue_by_segment_1h"] == timedelta(minutes=1)
    assert intervals["order_payments"] == timedelta(seconds=2)
    assert intervals["traffic_by_page_10m"] == timedelta(seconds=2)  # ingest computes it, in its micro-batches
    # A view ingest computes runs on an interval of its own inside the pass, never more often than ingest.
    spaced = speed_trigger_intervals(chosen.model_copy(update={"view_triggers": "traffic_by_page_10m=5s,customers=1s"}))
    assert (spaced["traffic_by_page_10m"], spaced["customers"]) == (timedelta(seconds=5), timedelta(seconds=2))
    with pytest.raises(ConfigError, match="ingest computes 'alerts' in each of its micro-batches"):
        speed_trigger_intervals(chosen.model_copy(update={"view_triggers": "alerts=5s"}))
    # Given explicitly, an interval may also be shorter than the view's refresh.
    given = chosen.model_copy(update={"view_triggers": "revenue_by_segment_1h=1s"})
    assert speed_trigger_intervals(given)["revenue_by_segment_1h"] == timedelta(seconds=1)
    with pytest.raises(ConfigError, match="LAMBDALAKE_VIEW_TRIGGERS=sessions=5s: unknown view 'sessions'"):
        speed_trigger_intervals(settings.model_copy(update={"view_triggers": "sessions=5s"}))


def test_views_that_need_not_be_fresh_to_the_second_refresh_less_often(settings):
    from include.views import speed_trigger_intervals
    from include.views.rules import DASHBOARD_REFRESH

    fast = settings.model_copy(update={"trigger_interval": timedelta(seconds=1)})
    intervals = speed_trigger_intervals(fast)
    assert {name for name, interval in intervals.items() if interval == timedelta(seconds=1)} == {
        "revenue_by_category_5m", "traffic_by_page_10m", "device_health_5m", "order_payments", "alerts",
        "customers"}
    assert {name for name, interval in intervals.items() if interval == DASHBOARD_REFRESH} == {
        "revenue_by_segment_1h", "user_sessions", "customers_history"}
    # A trigger interval longer than a view's refresh holds for it too.
    slow = settings.model_copy(update={"trigger_interval": timedelta(minutes=2)})
    assert set(speed_trigger_intervals(slow).values()) == {timedelta(minutes=2)}
