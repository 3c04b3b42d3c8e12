"""The alert notifier's e-mail path, against a real SMTP server (aiosmtpd) started by the test."""

from __future__ import annotations

import json
import socket

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Message

from include import tables
from include.notifier import notify
from include.lakehouse import open_store


class Inbox(Message):
    def __init__(self) -> None:
        super().__init__()
        self.messages = []

    def handle_message(self, message) -> None:  # noqa: ANN001 - email.message.Message
        self.messages.append(message)


@pytest.fixture
def smtp_server():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield inbox, port
    controller.stop()


def test_alerts_go_by_email_when_the_smtp_connection_exists(settings, smtp_server, monkeypatch):
    inbox, port = smtp_server
    monkeypatch.setenv("AIRFLOW_CONN_LAMBDALAKE_SMTP", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "lambdalake@example.com"}}))
    with_email = settings.model_copy(update={"alert_email_to": "oncall@example.com, data@example.com"})
    notify(with_email, "speed_layer_supervisor", "stream stalled; restarting", "warning", pid=42)

    (message,) = inbox.messages
    assert message["Subject"] == "[lambdalake warning] speed_layer_supervisor: stream stalled; restarting"
    assert message["From"] == "lambdalake@example.com"
    assert {address.strip() for address in message["To"].split(",")} == {"oncall@example.com", "data@example.com"}
    body = (message.get_payload()[0].get_payload(decode=True).decode() if message.is_multipart()
            else message.get_payload())
    assert "stream stalled; restarting" in body and '"pid": 42' in body.replace("&quot;", '"')
    assert open_store(settings).select_arrow(tables.ALERTS, ["message"]).to_pylist() == [
        {"message": "stream stalled; restarting"}]


def test_without_the_connection_the_alert_is_recorded_and_the_miss_logged(settings, smtp_server, caplog):
    inbox, _ = smtp_server
    notify(settings.model_copy(update={"alert_email_to": "oncall@example.com"}), "deadline", "late")
    assert inbox.messages == []
    assert "connection 'lambdalake_smtp' is not defined" in caplog.text
    assert open_store(settings).select_arrow(tables.ALERTS, ["message"]).to_pylist() == [{"message": "late"}]
