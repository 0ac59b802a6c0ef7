"""Renamed settings: the old environment name is still read, the new one wins when both are set, and a
process started with an old name logs its deprecation once (the settings module loaded in a fresh process,
as every role loads it)."""

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO

# A name "plugin.<field>" is read by the node plugin's environment (the plugin runs without the settings).
SHOW = """import json
names = %r
if any(not n.startswith("plugin.") for n in names):
    import config.settings as s
if any(n.startswith("plugin.") for n in names):
    from gpustack_models.plugin.environment import PluginEnvironment
    e = PluginEnvironment.read()
print(json.dumps({n: getattr(e, n[7:]) if n.startswith("plugin.") else getattr(s, n) for n in names}))
"""
# (new environment name, old one, the setting, a value, another value)
RENAMED = [
    ("GPUSTACK_API_URL", "GPUSTACK_WORKER_URL", "plugin.api_url", "https://api.example:8443", "https://old.example"),
    ("GPUSTACK_API_CA_FILE", "GPUSTACK_WORKER_CA_FILE", "plugin.api_ca_file", "/etc/api/ca.crt", "/etc/old/ca.crt"),
    ("GPUSTACK_PLUGIN_CERT_FROM_API", "GPUSTACK_PLUGIN_CERT_FROM_WORKER", "plugin.cert_from_api", "true", "false"),
    ("GPUSTACK_SERVICE_ACCOUNT", "GPUSTACK_WORKER_SERVICE_ACCOUNT", "SERVICE_ACCOUNT", "models-service", "old-account"),
]
IDS = [setting for _, _, setting, _, _ in RENAMED]


def load_settings(env: dict, names: list[str]) -> tuple[dict, list[str]]:
    """The settings ``names`` as a process with only ``env`` (of the GPUSTACK_* variables) reads them, and
    the lines it wrote to stderr."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUSTACK_")}
    out = subprocess.run(
        [sys.executable, "-c", SHOW % (names,)],
        cwd=REPO,
        env=base | env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout), out.stderr.splitlines()


def deprecations(lines: list[str]) -> list[str]:
    return [line for line in lines if "deprecated" in line]


def read(raw: str):
    """What a setting holds for ``raw``: a boolean's true or false, else the text itself."""
    return {"true": True, "false": False}.get(raw, raw)


@pytest.mark.parametrize("new, old, setting, value, other", RENAMED, ids=IDS)
def test_it_reads_the_old_name_with_a_deprecation(new, old, setting, value, other):
    values, stderr = load_settings({old: value}, [setting])
    assert values[setting] == read(value)
    assert deprecations(stderr) == [f"{old} is deprecated: set {new} instead"]


@pytest.mark.parametrize("new, old, setting, value, other", RENAMED, ids=IDS)
def test_it_reads_the_new_name_without_a_word(new, old, setting, value, other):
    values, stderr = load_settings({new: value}, [setting])
    assert values[setting] == read(value)
    assert deprecations(stderr) == []


@pytest.mark.parametrize("new, old, setting, value, other", RENAMED, ids=IDS)
def test_the_new_name_wins_over_the_old_one(new, old, setting, value, other):
    values, stderr = load_settings({new: value, old: other}, [setting])
    assert values[setting] == read(value)
    assert deprecations(stderr) == [f"{old} is deprecated and ignored: {new} is set"]


def test_each_old_name_is_said_once_at_start():
    values, stderr = load_settings({old: value for _, old, _, value, _ in RENAMED}, IDS)
    assert values == {setting: read(value) for _, _, setting, value, _ in RENAMED}
    assert sorted(deprecations(stderr)) == sorted(f"{old} is deprecated: set {new} instead" for new, old, *_ in RENAMED)
