"""The target's rendezvous point under hostile registrations (issue 13): every cap, on real libp2p
hosts over loopback. Hostile peers speak the rendezvous protocol with hand-made protobuf messages
(the py-libp2p client refuses to send most of them), an honest one uses ``announce``."""

from __future__ import annotations

from collections.abc import Iterator

import multiaddr
import pytest
import trio
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.discovery.rendezvous.config import RENDEZVOUS_PROTOCOL
from libp2p.discovery.rendezvous.pb.rendezvous_pb2 import Message
from libp2p.exceptions import BaseLibp2pError
from libp2p.io.exceptions import IncompleteReadError
from libp2p.peer.peerinfo import PeerInfo
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from node.client.http import http_json
from node.target import node as target_node
from node.target.engine import Engine
from node.target.http.api import build_app
from node.target.http.metrics import MAX_LISTED_DRAFTERS
from p2p import discovery
from p2p.discovery import REGISTRATION_TTL_S, RendezvousPoint, announce, drafter_namespace, withdraw
from p2p.host import make_host, parse_listen, parse_peer_addr, peer_addrs
from tests.httputil import MODEL, serving

NS = drafter_namespace("ab" * 32)
PEERS = 5  # hostile peers, each with its own id (a Sybil's ids cost nothing to mint)
SMALL_CAP = 3  # total registrations in the Sybil test: fewer than PEERS
REPLY_TIMEOUT_S = 10.0
Status = Message.ResponseStatus


@pytest.fixture(scope="module")
def net(portal) -> Iterator[tuple[IHost, list[IHost]]]:
    """(the target's host, PEERS hosts connected to it), on loopback with Noise."""

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        hosts = [make_host(create_new_key_pair()) for _ in range(PEERS + 1)]
        listen = [parse_listen("/ip4/127.0.0.1/tcp/0")]
        async with trio.open_nursery() as nursery:
            for host in hosts:
                await nursery.start(_serve, host, listen)
            target = parse_peer_addr(peer_addrs(hosts[0])[0])
            for peer in hosts[1:]:
                await peer.connect(target)
            task_status.started((hosts[0], hosts[1:]))

    value, stop = portal.start(run)
    yield value
    stop()


async def _serve(host: IHost, listen: list, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with host.run(listen_addrs=listen):
        task_status.started()
        await trio.sleep_forever()


def tcp_addrs(n: int) -> list[bytes]:
    return [multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{1024 + i}").to_bytes() for i in range(n)]


def register_msg(peer: IHost, addrs: list[bytes], *, ns: str = NS, ttl: int = REGISTRATION_TTL_S) -> Message:
    msg = Message(type=Message.REGISTER)
    msg.register.ns, msg.register.ttl = ns, ttl
    msg.register.peer.id = peer.get_id().to_bytes()
    msg.register.peer.addrs.extend(addrs)
    return msg


async def exchange(peer: IHost, target: IHost, raw: bytes) -> Message | None:
    """Send ``raw`` on a fresh rendezvous stream; the reply, or None if the point closed the stream."""
    stream = await peer.new_stream(target.get_id(), [RENDEZVOUS_PROTOCOL])
    try:
        with trio.fail_after(REPLY_TIMEOUT_S):
            try:
                await stream.write(raw)
                reply = await read_varint_prefixed_bytes_limited(stream, 1 << 22)
            except (IncompleteReadError, BaseLibp2pError):
                return None
        return Message.FromString(reply)
    finally:
        with trio.move_on_after(1.0):
            await stream.reset()


async def send(peer: IHost, target: IHost, msg: Message) -> Message | None:
    return await exchange(peer, target, encode_varint_prefixed(msg.SerializeToString()))


def stored(point: RendezvousPoint) -> dict:
    return {ns: dict(records) for ns, records in point.service.registrations.items()}


def test_many_addresses_are_truncated_to_the_cap(portal, net):
    target, peers = net
    point = RendezvousPoint(target, NS)
    addrs = tcp_addrs(1000)  # ~13 KB: within the message cap, far past the address cap
    reply = portal.run(send, peers[0], target, register_msg(peers[0], addrs))
    assert reply is not None and reply.registerResponse.status == Status.OK
    (record,) = stored(point)[NS].values()
    assert record.addrs == addrs[: discovery.MAX_ADDRS_PER_REGISTRATION]
    (registration,) = point.registrations()  # what the watch loop reads every tick
    assert registration.addrs == tuple(
        str(multiaddr.Multiaddr(a)) for a in addrs[: discovery.MAX_ADDRS_PER_REGISTRATION]
    )


def test_a_message_past_the_size_cap_is_refused_unread(portal, net):
    target, peers = net
    point = RendezvousPoint(target, NS)
    raw = register_msg(peers[0], tcp_addrs(10_000)).SerializeToString()  # ~130 KB, under py-libp2p's 4 MiB
    assert len(raw) > discovery.MAX_MESSAGE_BYTES
    assert portal.run(exchange, peers[0], target, encode_varint_prefixed(raw)) is None
    assert portal.run(exchange, peers[0], target, encode_varint_prefixed(b"\xff" * 50)) is None  # not protobuf
    assert not point.registrations() and not any(stored(point).values())
    reply = portal.run(send, peers[0], target, register_msg(peers[0], tcp_addrs(2)))  # the point still serves
    assert reply is not None and reply.registerResponse.status == Status.OK


def test_a_silent_stream_is_closed_after_the_request_deadline(portal, net, monkeypatch):
    target, peers = net
    monkeypatch.setattr(discovery, "REQUEST_TIMEOUT_S", 0.3)
    RendezvousPoint(target, NS)
    half = encode_varint_prefixed(b"x" * 100)[:20]  # a length prefix and part of a body, then silence
    assert portal.run(exchange, peers[0], target, half) is None  # closed by the point, well before REPLY_TIMEOUT_S


def test_foreign_namespaces_are_refused_and_never_stored(portal, net):
    target, peers = net
    point = RendezvousPoint(target, NS)
    for i, peer in enumerate(peers):
        reply = portal.run(send, peer, target, register_msg(peer, tcp_addrs(1), ns=f"spam/{i}"))
        assert reply is not None and reply.registerResponse.status == Status.E_INVALID_NAMESPACE
    discover = Message(type=Message.DISCOVER)
    discover.discover.ns = "spam/discover"
    reply = portal.run(send, peers[0], target, discover)
    assert reply is not None and reply.discoverResponse.status == Status.E_INVALID_NAMESPACE
    assert set(stored(point)) <= {NS} and not any(stored(point).values())


def test_the_ttl_is_clamped(portal, net):
    target, peers = net
    point = RendezvousPoint(target, NS)
    reply = portal.run(send, peers[0], target, register_msg(peers[0], tcp_addrs(1), ttl=72 * 3600))
    assert reply is not None and reply.registerResponse.status == Status.OK
    assert reply.registerResponse.ttl == discovery.MAX_TTL_S
    (record,) = stored(point)[NS].values()
    assert record.expires_at - record.registered_at == pytest.approx(discovery.MAX_TTL_S)


def test_sybils_cannot_grow_the_store_past_the_cap_nor_evict_incumbents(portal, net):
    target, peers = net
    point = RendezvousPoint(target, NS, max_registrations=SMALL_CAP)
    statuses = [portal.run(send, p, target, register_msg(p, tcp_addrs(2))).registerResponse.status for p in peers]
    assert statuses == [Status.OK] * SMALL_CAP + [Status.E_UNAVAILABLE] * (PEERS - SMALL_CAP)
    incumbents = {str(p.get_id()) for p in peers[:SMALL_CAP]}
    assert {r.peer_id for r in point.registrations()} == incumbents
    refresh = portal.run(send, peers[0], target, register_msg(peers[0], tcp_addrs(2)))
    assert refresh.registerResponse.status == Status.OK  # a refresh takes no new room
    assert point.stats() == {"registrations": SMALL_CAP, "capacity": SMALL_CAP, "refused_full": PEERS - SMALL_CAP}
    # an expired registration makes room for a newcomer: the live incumbents keep their places
    short = portal.run(send, peers[1], target, register_msg(peers[1], tcp_addrs(2), ttl=1))
    assert short.registerResponse.status == Status.OK
    portal.run(trio.sleep, 1.1)
    newcomer = portal.run(send, peers[-1], target, register_msg(peers[-1], tcp_addrs(2)))
    assert newcomer.registerResponse.status == Status.OK
    expected = incumbents - {str(peers[1].get_id())} | {str(peers[-1].get_id())}
    assert {r.peer_id for r in point.registrations()} == expected
    assert sum(map(len, stored(point).values())) == SMALL_CAP


def test_an_honest_drafter_registers_and_is_discovered(portal, net):
    target, peers = net
    point = RendezvousPoint(target, NS)
    honest, bootstrap = peers[0], PeerInfo(target.get_id(), target.get_addrs())
    seen: list[discovery.Registration] = []
    gone: list[str] = []

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(point.watch, seen.append, gone.append)
            await nursery.start(announce, honest, bootstrap, NS)
            with trio.fail_after(REPLY_TIMEOUT_S):
                while not seen:
                    await trio.sleep(0.05)
            await withdraw(honest, bootstrap, NS)
            with trio.fail_after(REPLY_TIMEOUT_S):
                while not gone:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    portal.run(scenario)
    assert seen[0].peer_id == str(honest.get_id()) and gone == [seen[0].peer_id]
    assert 0 < len(seen[0].addrs) <= discovery.MAX_ADDRS_PER_REGISTRATION
    assert set(seen[0].addrs) <= {str(a).split("/p2p/")[0] for a in honest.get_addrs()}  # bare transport addrs


def test_a_drafter_whose_connection_dropped_still_withdraws(portal, net):
    """A drafter stopped while its connection to the target was closing (a network blip, the
    target's side closing it; py-libp2p lists such a connection until its close completes) used to
    log "could not unregister: No valid connections available" and stay listed until its
    registration's TTL ran out; it now dials afresh to withdraw."""
    target, peers = net
    point = RendezvousPoint(target, NS)
    peer, bootstrap = peers[-1], PeerInfo(target.get_id(), target.get_addrs())
    listed = []

    async def scenario() -> None:
        reply = await send(peer, target, register_msg(peer, tcp_addrs(1)))
        assert reply is not None and reply.registerResponse.status == Status.OK
        listed.append(len(stored(point).get(NS, {})))
        (conn,) = peer.get_network().get_connections(target.get_id())
        conn.event_closed.set()  # the state of a connection whose close is under way: listed, not usable
        await withdraw(peer, bootstrap, NS)
        listed.append(len(stored(point).get(NS, {})))

    portal.run(scenario)
    assert listed == [1, 0]


def test_health_shows_a_bounded_drafter_list_and_the_total(pair):
    rows = {f"12D3KooWPeer{i:03d}": {"credited_tokens": i, "known_for_s": 1.0} for i in range(100)}
    ranked = target_node.ranked_drafters(rows)
    assert list(ranked)[:3] == ["12D3KooWPeer099", "12D3KooWPeer098", "12D3KooWPeer097"]  # most credited first
    with serving({"main": build_app(Engine(pair, model_name=MODEL, gamma=4), lambda: {"drafters": ranked})}) as urls:
        health = http_json(f"{urls['main']}/health")
    assert health["drafters_total"] == len(rows)
    assert list(health["drafters"]) == list(ranked)[:MAX_LISTED_DRAFTERS]


def test_a_discover_is_answered_with_the_askers_own_registration_only(portal, net):
    """No amplification: however many drafters are registered, with as many addresses as fit, a
    DISCOVER draws at most the asker's own registration (a stranger gets an empty list)."""
    target, peers = net
    RendezvousPoint(target, NS)
    for peer in peers[:-1]:
        assert portal.run(send, peer, target, register_msg(peer, tcp_addrs(40))).registerResponse.status == Status.OK
    discover = Message(type=Message.DISCOVER)
    discover.discover.ns = NS
    request_bytes = len(discover.SerializeToString())
    own = portal.run(send, peers[0], target, discover).discoverResponse
    assert own.status == Status.OK and [r.peer.id for r in own.registrations] == [peers[0].get_id().to_bytes()]
    assert len(own.SerializeToString()) <= request_bytes + discovery.MAX_ADDRS_PER_REGISTRATION * 64
    stranger = portal.run(send, peers[-1], target, discover).discoverResponse
    assert stranger.status == Status.OK and list(stranger.registrations) == []


SYBILS = 300  # registered ids, far past what a view lists


def test_status_and_metrics_stay_bounded_and_read_no_ledger_under_sybils(pair, tmp_path, monkeypatch):
    """Peer ids are free to mint. With SYBILS registered ids, a status view lists the best
    MAX_LISTED_DRAFTERS and sums the rest, /metrics has series for those and one summed
    "(others)", and no view reads the ledger on the loop (its credits are mirrored in memory)."""
    from market.ledger import Ledger
    from node.target.config import TargetConfig
    from node.target.http.metrics import OTHERS_LABEL
    from tests.httputil import metrics

    data_dir = tmp_path / "target"
    with Ledger(data_dir / target_node.LEDGER_FILE) as ledger:  # a drafter credited in an earlier run
        ledger.credit("job-earlier", {"12D3KooWHonest": (7, 9)})
    node = target_node.TargetNode(TargetConfig(data_dir=data_dir), pair)
    reads: list[str] = []
    monkeypatch.setattr(Ledger, "_query", lambda self, sql, args=(): reads.append(sql) or [])
    node.registry.upsert("12D3KooWHonest", [])
    for i in range(SYBILS):
        node.registry.upsert(f"12D3KooWSybil{i:04d}", [])
        node.registry.record_job(f"12D3KooWSybil{i:04d}")
    view = node.status()
    shown = MAX_LISTED_DRAFTERS
    assert view["drafters_total"] == SYBILS + 1 and len(view["drafters"]) == shown
    assert next(iter(view["drafters"])) == "12D3KooWHonest"  # most credited first, from the mirror
    assert view["drafters"]["12D3KooWHonest"]["credited_tokens"] == 7
    assert view["drafters_others"]["drafters"] == SYBILS + 1 - shown
    assert view["drafters_others"]["jobs"] == SYBILS + 1 - shown  # one job each, summed
    with serving({"main": build_app(Engine(pair, model_name=MODEL, gamma=4), node.status)}) as urls:
        health = http_json(f"{urls['main']}/health")
        dashboard = http_json(f"{urls['main']}/api/dashboard")
        samples, _, text = metrics(urls["main"])
    assert health["drafters_total"] == dashboard["drafters_total"] == SYBILS + 1
    assert samples["specmarket_drafters_known"] == SYBILS + 1
    peers = {line.split('peer="', 1)[1].split('"', 1)[0] for line in text.splitlines() if 'peer="' in line}
    assert len(peers) == shown + 1 and OTHERS_LABEL in peers
    assert f'specmarket_drafter_jobs_total{{peer="{OTHERS_LABEL}"}} {SYBILS + 1 - shown}.0' in text
    assert reads == [], reads
    node.close()
