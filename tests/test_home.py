"""The environment the CLI sets before Prefect reads its settings (`dpcore.home.configure_environment`)."""

from __future__ import annotations

import os

import pytest

from dpcore import home

SERVER_KEYS = tuple(home.TEMPORARY_SERVER_SETTINGS)


@pytest.fixture()
def fresh_environment(monkeypatch):
    """This process's environment without the temporary server's settings or a server URL (restored after)."""
    for key in (*SERVER_KEYS, "PREFECT_API_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(home, "_DEFAULTED", set())


def test_a_run_without_a_server_url_starts_its_temporary_server_without_events(fresh_environment):
    home.configure_environment()
    assert {key: os.environ[key] for key in SERVER_KEYS} == dict.fromkeys(SERVER_KEYS, "false")
    # `dpicl ui`'s long-lived server keeps Prefect's defaults
    assert not set(SERVER_KEYS) & set(home.long_lived_server_environment(dict(os.environ)))


def test_a_users_own_value_is_kept_everywhere(fresh_environment, monkeypatch):
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED", "true")
    home.configure_environment()
    assert os.environ["PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED"] == "true"
    assert os.environ["PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED"] == "false"
    kept = home.long_lived_server_environment(dict(os.environ))
    assert kept["PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED"] == "true"
    assert "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED" not in kept


def test_a_run_sent_to_a_server_leaves_its_settings_alone(fresh_environment, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    home.configure_environment()
    assert not set(SERVER_KEYS) & set(os.environ)
