"""The fetch ticket on its own: digests, each hub's URLs and credentials, what ``validate`` refuses, the
wire form read back (and a malformed one refused), secrets kept out of every text, the peers kept."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from gpustack_models.plugin.engine.failures import INVALID_REQUEST, DownloadFailed
from gpustack_models.plugin.engine.ticket import (
    HUGGING_FACE,
    MODEL_SCOPE,
    FetchTicket,
    HubSource,
    PeerSource,
    digest_hex,
    origin,
    redact_url,
    ticket_files,
    usable_peers,
)
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

TOKEN = "hf_s3cr3t"


def file(path: str, data: bytes, algorithm: str = "sha256") -> ManifestFile:
    if algorithm == "sha256":
        return ManifestFile(path, len(data), "sha256", hashlib.sha256(data).hexdigest(), True)
    return ManifestFile(path, len(data), "gitsha1", hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())


FILES = (file("config.json", b"{}", "gitsha1"), file("model.safetensors", b"weights"))


def ticket(**changes) -> FetchTicket:
    base = FetchTicket(manifest_digest(FILES), HUGGING_FACE, "https://hub.example/", "org/model", "c0ffee", FILES)
    return dataclasses.replace(base, **changes)


def refusal(t: FetchTicket) -> str:
    with pytest.raises(DownloadFailed) as caught:
        t.validate()
    assert caught.value.reason == INVALID_REQUEST
    return caught.value.message


def test_it_takes_a_digest_only_as_sha256_and_64_lowercase_hex():
    assert digest_hex("sha256:" + "ab" * 32) == "ab" * 32
    for bad in ("sha256:" + "AB" * 32, "sha256:" + "ab" * 31, "md5:" + "ab" * 32, "sha256:../" + "a" * 61, None):
        with pytest.raises(ValueError):
            digest_hex(bad)


def test_it_hides_a_proxys_password_and_makes_ports_explicit():
    assert redact_url("http://user:pw@proxy:3128") == "http://user:***@proxy:3128"
    assert redact_url("http://proxy:3128") == "http://proxy:3128"
    assert redact_url(None) is None
    assert origin("https://Hub.Example/x") == ("https", "hub.example", 443)
    assert origin("http://hub.example/x") == ("http", "hub.example", 80)
    assert origin("http://hub.example:8080/x") == ("http", "hub.example", 8080)


def test_it_names_each_hubs_file_urls_and_credentials():
    hf = HubSource(HUGGING_FACE, "https://hub.example/", "org/model", "c0ffee", TOKEN)
    ms = HubSource(MODEL_SCOPE, "https://ms.example", "org/model", "v1.0", TOKEN)
    weights = file("dir/a b#.bin", b"x")

    assert hf.url(weights) == "https://hub.example/org/model/resolve/c0ffee/dir/a%20b%23.bin"
    assert ms.url(weights) == "https://ms.example/api/v1/models/org/model/repo?Revision=v1.0&FilePath=dir%2Fa+b%23.bin"
    assert hf.hub_headers() == {"Authorization": f"Bearer {TOKEN}"}
    assert ms.hub_headers() == {"Authorization": f"Bearer {TOKEN}", "Cookie": f"m_session_id={TOKEN}"}
    assert dataclasses.replace(hf, token=None).hub_headers() == {}


def test_it_validates_a_ticket_whose_files_hash_to_its_digest():
    assert ticket().validate().endpoint == "https://hub.example"
    assert "not to the ticket's digest" in refusal(ticket(digest=manifest_digest(FILES[:1])))
    assert "digest must be" in refusal(ticket(digest="sha256:" + "0" * 63))


@pytest.mark.parametrize(
    "files, says",
    [
        ((), "has no file"),
        ((FILES[1], FILES[1]), "appears twice"),
        ((file("a", b"1"), file("a/b", b"2")), "both a file and a directory"),
    ],
    ids=["empty", "twice", "file-and-directory"],
)
def test_it_refuses_files_no_tree_can_hold(files, says):
    assert says in refusal(ticket(files=files))  # checked before the files' digest


def test_it_refuses_connection_settings_it_cannot_use(tmp_path):
    assert "proxy must be an http:// URL" in refusal(ticket(proxy="https://user:pw@proxy:3128"))
    assert "pw" not in refusal(ticket(proxy="socks5://user:pw@proxy:1080"))
    assert "not a readable file" in refusal(ticket(ca_bundle=str(tmp_path / "missing.pem")))
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    ticket(proxy="http://proxy:3128", ca_bundle=str(tmp_path / "ca.pem")).validate()


def test_it_refuses_a_modelscope_file_named_by_its_git_blob():
    files = (file("config.json", b"{}", "gitsha1"),)
    hf = ticket(files=files, digest=manifest_digest(files))
    hf.validate()
    assert "identified by sha256" in refusal(dataclasses.replace(hf, source=MODEL_SCOPE))
    via_fallback = dataclasses.replace(hf, fallbacks=(HubSource(MODEL_SCOPE, "https://ms.example", "org/m", "v1"),))
    assert "identified by sha256" in refusal(via_fallback)


def test_it_reads_its_wire_form_back_and_a_files_checksum_form():
    t = ticket(token=TOKEN, proxy="http://proxy:3128", peers=(PeerSource("n1", "https://10.0.0.1:9443/"),), joining=2)
    wire = t.to_dict(include_token=True)
    assert FetchTicket.from_dict(wire) == t
    assert FetchTicket.from_dict(wire, token="other").token == "other"
    assert "token" not in t.to_dict() and FetchTicket.from_dict(t.to_dict()).token is None

    checksums = {**wire, "files": [{"path": f.path, "size": f.size, "checksum": f.checksum} for f in FILES]}
    assert [f.hexdigest for f in FetchTicket.from_dict(checksums).files] == [f.hexdigest for f in FILES]
    for joining in (True, -1, "2"):
        assert FetchTicket.from_dict({**wire, "joining": joining}).joining is None


@pytest.mark.parametrize(
    "key, value",
    [
        ("digest", None),
        ("files", [{"path": "../x", "size": 1, "checksum": "sha256:" + "0" * 64}]),
        ("files", [{"path": "x", "size": "big", "algorithm": "sha256", "hexdigest": "0" * 64}]),
        ("sources", [{"source": HUGGING_FACE}]),
    ],
    ids=["no-digest", "escaping-path", "size-not-a-number", "source-without-endpoint"],
)
def test_it_refuses_a_malformed_wire_form_as_an_invalid_request(key, value):
    wire = {**ticket().to_dict(), key: value}
    if value is None:
        del wire[key]
    with pytest.raises(DownloadFailed) as caught:
        FetchTicket.from_dict(wire)
    assert caught.value.reason == INVALID_REQUEST


def test_it_keeps_tokens_and_proxy_passwords_out_of_its_texts():
    fallback = HubSource(HUGGING_FACE, "https://mirror.example", "org/model", "c0ffee", "hf_other")
    t = ticket(token=TOKEN, proxy="http://user:pw@proxy:3128", fallbacks=(fallback,))
    for text in (repr(t), str(t), repr(t.sources), repr(fallback)):
        assert TOKEN not in text and "hf_other" not in text and ":pw@" not in text
    assert "<redacted>" in repr(t)


def test_it_lists_files_in_manifest_order():
    files = [file("b", b"1"), file("a/z", b"2"), file("a", b"3"), file("É", b"4"), file("Z", b"5")]
    assert [f.path for f in ticket_files(files)] == ["Z", "a", "a/z", "b", "É"]


def test_a_tickets_peers_are_checked_and_malformed_ones_dropped():
    peers = usable_peers(
        [
            {"node": "n1", "url": "https://10.0.0.1:9443", "state": "Ready"},
            {"node": "n2", "url": "http://10.0.0.2:9443", "state": "Ready"},  # no TLS
            {"node": "n3", "url": "https://10.0.0.3:9443/x", "state": "Ready"},  # a path
            {"node": "N4!", "url": "https://10.0.0.4:9443", "state": "Ready"},
            {"node": "n5", "url": "https://10.0.0.5:9443", "state": "Gone"},
            {"node": "n1", "url": "https://10.0.0.9:9443", "state": "Ready"},  # twice
            {"url": "https://10.0.0.6:9443"},
            "garbage",
        ]
    )
    assert peers == (PeerSource("n1", "https://10.0.0.1:9443", "Ready"),)
