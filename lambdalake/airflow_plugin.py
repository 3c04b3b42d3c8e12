"""The Airflow plugin: the dashboard in Airflow's UI, behind Airflow's own login.

Installing the project registers it (the ``airflow.plugins`` entry point in pyproject.toml).
Airflow's API server mounts the serving layer's HTTP app (:func:`serving.http.create_app`: the
same engine, API and dashboard files as ``lambdalake serve``) at ``/lambdalake``, on the
lakehouse of the settings in its environment (``LAMBDALAKE_HOME``), and the UI's "Lambdalake"
entry shows that page in a frame. The page's requests carry Airflow's login cookie and the API
checks it with Airflow's own dependency; the ``lambdalake serve`` token plays no part here.

Airflow imports plugins in every one of its processes: this module imports nothing but Airflow's
plugin class, and the app (DuckDB, Arrow, delta-rs) is built only when the API server asks for it.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

log = logging.getLogger(__name__)
URL_PREFIX = "/lambdalake"
# Airflow's serving engine re-reads the lake as often as the dashboard redraws.
REFRESH_SECONDS = 5.0


@cache
def dashboard_app() -> Any:
    """The serving layer's app with Airflow's login in place of the token (one per API server process)."""
    from airflow.api_fastapi.core_api.security import requires_authenticated
    from fastapi import Depends

    from include.config import load_settings
    from serving.http import create_app

    return create_app(load_settings(), token=None, refresh_seconds=REFRESH_SECONDS,
                      login=Depends(requires_authenticated()))


class LambdalakePlugin(AirflowPlugin):
    name = "lambdalake"
    external_views = [{"name": "Lambdalake", "href": f"{URL_PREFIX}/", "url_route": "lambdalake",
                       "destination": "nav", "nav_top_level": True}]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # a property: only the API server reads it
        from include.config import ConfigError

        try:
            app = dashboard_app()
        except ConfigError as error:  # a wrong LAMBDALAKE_* setting must not keep Airflow's API server down
            log.error("the lambdalake dashboard is off: %s", error)
            return []
        return [{"app": app, "url_prefix": URL_PREFIX, "name": "lambdalake dashboard"}]
