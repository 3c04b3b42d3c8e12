"""Asset events posted to Airflow 3 through its REST API, by processes that are not Airflow tasks
(the stream). The address and credentials are the Airflow connection ``lambdalake_airflow``
(type ``http``: host, port, login, password; schema ``https`` for TLS), which such a process
reads from the environment variable Airflow documents for connections,
``AIRFLOW_CONN_LAMBDALAKE_AIRFLOW`` (a connection URI, or its JSON form). The supervisor task
resolves the connection wherever it is defined (metastore, secrets backend, environment) and
passes it on to the stream it starts.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

AIRFLOW_CONN_ID = "lambdalake_airflow"
AIRFLOW_CONN_ENV = f"AIRFLOW_CONN_{AIRFLOW_CONN_ID.upper()}"


class AirflowUnavailable(RuntimeError):
    """Airflow did not take the request; the message says why in one line."""


@dataclass(frozen=True)
class AirflowApi:
    """Where Airflow's REST API is and who signs in (``repr`` leaves the password out)."""

    base_url: str
    login: str
    password: str

    def __repr__(self) -> str:
        return f"AirflowApi({self.base_url!r}, login={self.login!r})"

    @classmethod
    def from_connection(cls, value: str) -> AirflowApi:
        """From an Airflow connection as ``AIRFLOW_CONN_*`` holds it: a URI
        (``http://admin:secret@localhost:8080``) or JSON (``{"conn_type": "http", "host": ...}``)."""
        if value.lstrip().startswith("{"):
            fields = json.loads(value)
            scheme = fields.get("schema") or "http"
            host, port = fields.get("host") or "", fields.get("port")
            login, password = fields.get("login") or "", fields.get("password") or ""
        else:
            uri = urllib.parse.urlsplit(value)
            scheme = urllib.parse.unquote(uri.path.strip("/")) or ("https" if uri.scheme == "https" else "http")
            host, port = urllib.parse.unquote(uri.hostname or ""), uri.port
            login, password = (urllib.parse.unquote(part or "") for part in (uri.username, uri.password))
        if "://" in host:  # a host given as a URL: Airflow's UI accepts that for http connections
            parts = urllib.parse.urlsplit(host)
            scheme, host, port = parts.scheme, parts.hostname or "", port or parts.port
        if not host:
            raise ValueError(f"the Airflow connection '{AIRFLOW_CONN_ID}' has no host")
        if scheme not in ("http", "https"):
            raise ValueError(f"the Airflow connection '{AIRFLOW_CONN_ID}' schema must be http or https, got '{scheme}'")
        netloc = f"[{host}]" if ":" in host else host
        return cls(f"{scheme}://{netloc}{f':{port}' if port else ''}", login, password)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> AirflowApi | None:
        """The ``lambdalake_airflow`` connection from the environment, or None when it is not set."""
        value = environ.get(AIRFLOW_CONN_ENV, "").strip()
        return cls.from_connection(value) if value else None

    def _call(self, method: str, path: str, body: Any = None, token: str | None = None,
              timeout: float = 10) -> Any:
        request = urllib.request.Request(
            f"{self.base_url}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise AirflowUnavailable(f"{method} {self.base_url}{path}: HTTP {error.code} {error.reason}") from None
        except (OSError, ValueError) as error:  # refused, unreachable, timed out, not JSON
            reason = getattr(error, "reason", error)
            raise AirflowUnavailable(f"{method} {self.base_url}{path}: {reason}") from None

    def post_asset_event(self, uri: str, extra: dict[str, Any]) -> dict[str, Any]:
        """Record an event of the asset ``uri`` (which a DAG must declare, so that Airflow knows
        it); returns the event Airflow created. Raises :class:`AirflowUnavailable`."""
        token = self._call("POST", "/auth/token", {"username": self.login, "password": self.password})["access_token"]
        query = urllib.parse.urlencode({"uri_pattern": uri})
        assets = [a for a in self._call("GET", f"/api/v2/assets?{query}", token=token)["assets"] if a["uri"] == uri]
        if not assets:
            raise AirflowUnavailable(f"Airflow at {self.base_url} knows no asset '{uri}' (no nightly DAG?)")
        return self._call("POST", "/api/v2/assets/events", {"asset_id": assets[0]["id"], "extra": extra}, token)


def connection_env() -> dict[str, str]:
    """Inside an Airflow task: the ``lambdalake_airflow`` connection, wherever Airflow finds it
    (metastore, secrets backend, environment), as the environment variable a process started by
    the task reads (:meth:`AirflowApi.from_env`); empty when the connection is not defined."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        connection = Connection.get(AIRFLOW_CONN_ID)
    except AirflowNotFoundException:
        return {}
    return {AIRFLOW_CONN_ENV: connection.as_json()}
