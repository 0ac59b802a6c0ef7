"""progress without the plugin CA or its key: no node is read live, and the answer is still given (never a 500)."""

import asyncio

from gpustack_models.api import progress
from gpustack_models.api.plugin_client import ServiceClient
from gpustack_models.local import pki


def test_progress_reads_no_plugin_live_when_their_ca_cannot_be_loaded(settings, tmp_path, monkeypatch):
    crt, key = pki.new_ca("plugin-ca").write(tmp_path, "ca")
    for ca_file, key_file in [(tmp_path / "missing-ca.crt", key), (crt, ""), (crt, tmp_path / "missing.key")]:
        settings.PLUGIN_CA_FILE, settings.PLUGIN_CA_KEY_FILE = str(ca_file), str(key_file)
        monkeypatch.setattr(progress, "service_client", ServiceClient())
        progress._sessions.clear()
        answered = asyncio.run(progress.read_live({"node-a": "127.0.0.1"}, "sha256:" + "0" * 64, 1.0))
        assert answered == {}
