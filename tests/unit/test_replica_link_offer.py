"""The replica link's pure parts (danube.ingest.replica_link): what an epochs answer's offer
must be to be used, the ticket's check, and the bound on links per leader."""

from __future__ import annotations

import pytest

from danube.ingest.replica_link import (
    LinkOffer,
    ReplicaLinks,
    fetch_path,
    new_ticket,
    ticket_matches,
)
from danube.meta import TopicName

pytestmark = pytest.mark.unit

P = TopicName("default", "orders-part-3")


def test_an_offer_is_used_only_over_plain_http_and_whole() -> None:
    ticket = new_ticket()
    good = {"url": "http://10.0.0.7:7201", "ticket": ticket}
    assert LinkOffer.from_json(good) == LinkOffer("http://10.0.0.7:7201", ticket)
    refused: list[object] = [
        None,  # an older leader offers none
        "http://10.0.0.7:7201",
        {"url": "https://10.0.0.7:7201", "ticket": ticket},  # TLS: no trust store for it
        {"url": "ftp://10.0.0.7", "ticket": ticket},
        {"url": "http://", "ticket": ticket},
        {"url": "http://[::1", "ticket": ticket},  # not a URL
        {"url": "http://h:1", "ticket": ""},
        {"url": "http://h:1", "ticket": "x" * 65},
        {"url": "http://h:1/" + "a" * 2048, "ticket": ticket},
        {"url": 7, "ticket": ticket},
        {"url": "http://h:1", "ticket": 7},
        {"ticket": ticket},
    ]
    for value in refused:
        assert LinkOffer.from_json(value) is None, value


def test_the_ticket_must_match_exactly() -> None:
    ticket = new_ticket()
    assert ticket != new_ticket()  # one per leadership term
    assert ticket_matches(ticket, ticket)
    assert not ticket_matches(ticket, None)
    assert not ticket_matches(ticket, "")
    assert not ticket_matches(ticket, ticket[:-1])
    assert not ticket_matches(ticket, ticket + "A")
    assert not ticket_matches(ticket, new_ticket())


def test_a_node_offers_a_link_only_on_a_plain_http_door() -> None:
    links = ReplicaLinks()
    assert links.offer("t") is None  # no door yet
    links.serve_at("http://127.0.0.1:7201")
    assert links.offer("t") == LinkOffer("http://127.0.0.1:7201", "t")
    links.serve_at("https://127.0.0.1:7201")
    assert links.offer("t") is None
    links.serve_at("http://127.0.0.1:7201")
    links.serve_at(None)  # the door closes: none offered
    assert links.offer("t") is None


async def test_links_to_one_leader_are_bounded_and_given_back() -> None:
    links = ReplicaLinks(per_leader=2)
    offer = LinkOffer("http://127.0.0.1:9", new_ticket())
    first = links.open("a", offer, P)
    second = links.open("a", offer, P)
    assert first is not None
    assert second is not None
    assert links.open("a", offer, P) is None  # the third partition of "a" uses the bus
    other = links.open("b", offer, P)
    assert other is not None
    assert links.held == 3
    await first.close()
    await first.close()  # once only
    assert links.held == 2
    again = links.open("a", offer, P)
    assert again is not None
    for link in (second, other, again):
        await link.close()
    assert links.held == 0


def test_the_path_names_the_partition() -> None:
    assert fetch_path(P) == "/v1/replicas/default/orders-part-3/fetch"
