"""progress without the plugins' CA: no node is read live, and the answer is still given (never a 500)."""

import asyncio


def test_progress_reads_no_plugin_live_when_their_ca_cannot_be_loaded(settings, tmp_path):
    from gpustack_models.api import progress

    settings.PLUGIN_CA_FILE = str(tmp_path / "missing-ca.crt")
    progress._sessions.clear()
    answered = asyncio.run(progress.read_live({"node-a": "127.0.0.1"}, "sha256:" + "0" * 64, 1.0, {}))
    assert answered == {}
