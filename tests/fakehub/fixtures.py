"""Pytest fixtures for talking to a ``FakeHub`` with the real clients.

The root ``conftest.py`` loads this module with ``pytest_plugins``: every test may ask for ``fakehub``
(a fresh hub per test) and ``hub_env``.
"""

from __future__ import annotations

import pytest

from tests.fakehub.server import FakeHub

LOOPBACK = "127.0.0.1,127.0.0.2,localhost"
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
_CREDENTIAL_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MODELSCOPE_API_TOKEN", "HF_HUB_OFFLINE")


def _reset_modelscope_config() -> None:
    # modelscope_hub reads MODELSCOPE_ENDPOINT / MODELSCOPE_HOME once, into a process-wide config.
    from modelscope_hub.config import set_default_config

    set_default_config(None)


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """The clients' environment for a test: loopback never proxied, no saved or ambient credentials,
    every cache and config directory under the test's tmp_path, no Xet transfers (the fake hub has no
    Xet storage service: Xet-backed files download over HTTP, through the hub's redirect). Returns
    the monkeypatch."""
    from huggingface_hub import constants as hf_constants

    for name in _PROXY_VARIABLES + _CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", LOOPBACK)
    monkeypatch.setenv("no_proxy", LOOPBACK)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # for clients started in a subprocess
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)  # read at import by this process's client
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "modelscope-home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope-cache"))
    _reset_modelscope_config()
    yield monkeypatch
    _reset_modelscope_config()


@pytest.fixture
def fakehub(hub_env):
    """A started ``FakeHub``; ``MODELSCOPE_ENDPOINT`` points at it. Stopped after the test."""
    with FakeHub() as hub:
        hub_env.setenv("MODELSCOPE_ENDPOINT", hub.url)
        _reset_modelscope_config()
        yield hub
