"""p2p host factory: persisted identity, Noise-only security, address parsing."""

from __future__ import annotations

import stat

import pytest
from libp2p.peer.id import ID
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID

from p2p.discovery import drafter_namespace
from p2p.host import IDENTITY_NAME, KEYS_SUBDIR, InvalidAddress, load_identity, make_host, parse_peer_addr


def test_identity_persists_and_is_private(tmp_path):
    first = load_identity(tmp_path)
    again = load_identity(tmp_path)
    assert ID.from_pubkey(first.public_key) == ID.from_pubkey(again.public_key)
    mode = (tmp_path / KEYS_SUBDIR / f"{IDENTITY_NAME}.key").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert ID.from_pubkey(load_identity(tmp_path / "other").public_key) != ID.from_pubkey(first.public_key)


def test_host_offers_noise_only(tmp_path):
    host = make_host(load_identity(tmp_path))
    offered = list(host.get_network().upgrader.security_multistream.transports)
    assert offered == [NOISE_PROTOCOL_ID]


@pytest.mark.parametrize("text", ["", "not-an-addr", "/ip4/127.0.0.1/tcp/4001", "/ip4/1.2.3.4/tcp/1/p2p/xyz"])
def test_bad_peer_addresses_are_clear_errors(text):
    with pytest.raises(InvalidAddress, match="/p2p/"):
        parse_peer_addr(text)


def test_namespace_carries_the_tokenizer_fingerprint():
    assert drafter_namespace("ab" * 32) == "specmarket/drafters/" + "ab" * 32
