"""Tokens (issue, verify, expiry, issuer, audience, wrong key, unknown kid, rotation), API
keys, the RBAC decision at each scope, what a principal may ask about itself (its
permissions and bindings, never counted as denials), and that every HTTP route and gRPC method
has a permission rule (default deny)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute, APIWebSocketRoute

from danube.admission.counters import AdmissionCounters
from danube.config import SecurityConfig
from danube.discovery.doors.console import load_static
from danube.discovery.doors.grpc.server import method_handlers
from danube.discovery.doors.http import build_app
from danube.discovery.doors.http.auth import AUTHENTICATED, PER_TOPIC, PUBLIC, ROUTES
from danube.grpc_door.auth import METHODS
from danube.meta import TopicName
from danube.security import (
    Binding,
    Permission,
    PermissionDeniedError,
    Policy,
    Resource,
    Role,
    TokenVerifier,
    UnauthenticatedError,
    decide,
    ensure_signing_key,
    generate_key,
    issue_token,
    load_keys,
)
from danube.security.apikeys import ApiKeyRecord, check_secret, new_api_key, parse_api_key
from danube.security.gate import SecurityGate
from danube.security.tokens import public_pem

P = Permission
ISS, AUD = "danube-test", "danube-api"


def _verifier(keys_dir: Path) -> TokenVerifier:
    return TokenVerifier(load_keys(keys_dir).public, issuer=ISS, audience=AUD)


def test_token_round_trip_names_the_principal(tmp_path: Path) -> None:
    key = ensure_signing_key(tmp_path)
    again = ensure_signing_key(tmp_path)  # made once, then found
    assert (again.kid, public_pem(again)) == (key.kid, public_pem(key))
    token = issue_token(key, "alice", 60, issuer=ISS, audience=AUD)
    claims = _verifier(tmp_path).verify(token)
    assert (claims.principal, claims.kid) == ("alice", key.kid)
    assert claims.expires_at_s == pytest.approx(time.time() + 60, abs=2)
    assert (tmp_path / f"{key.kid}.pem").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        ({"now_s": time.time() - 3600}, "token_expired", "expired"),
        ({"audience": "elsewhere"}, "invalid_token", "audience"),
        ({"issuer": "someone-else"}, "invalid_token", "issuer"),
    ],
)
def test_bad_tokens_are_refused(
    tmp_path: Path, change: dict[str, Any], code: str, words: str
) -> None:
    key = ensure_signing_key(tmp_path)
    args: dict[str, Any] = {"issuer": ISS, "audience": AUD} | change
    token = issue_token(key, "alice", 60, **args)
    with pytest.raises(UnauthenticatedError) as caught:
        _verifier(tmp_path).verify(token)
    assert caught.value.code == code
    assert words in caught.value.message
    assert token not in str(caught.value)


def test_token_signed_by_another_key_with_a_listed_kid_is_refused(tmp_path: Path) -> None:
    listed = ensure_signing_key(tmp_path / "cluster")
    forger = generate_key(tmp_path / "forger", kid=listed.kid)  # same kid, other key
    token = issue_token(forger, "mallory", 60, issuer=ISS, audience=AUD)
    with pytest.raises(UnauthenticatedError, match="signature"):
        _verifier(tmp_path / "cluster").verify(token)


def test_unknown_kid_and_garbage_are_refused(tmp_path: Path) -> None:
    ensure_signing_key(tmp_path / "cluster")
    other = ensure_signing_key(tmp_path / "other")
    token = issue_token(other, "mallory", 60, issuer=ISS, audience=AUD)
    with pytest.raises(UnauthenticatedError, match="unknown key id"):
        _verifier(tmp_path / "cluster").verify(token)
    with pytest.raises(UnauthenticatedError, match="malformed"):
        _verifier(tmp_path / "cluster").verify("not.a.token")


def test_rotation_old_key_verifies_while_listed(tmp_path: Path) -> None:
    old = generate_key(tmp_path, kid="k1")
    old_token = issue_token(old, "alice", 60, issuer=ISS, audience=AUD)
    new = generate_key(tmp_path, kid="k2")
    keys = load_keys(tmp_path)
    assert keys.signing is not None
    assert keys.signing.kid == "k2"
    new_token = issue_token(keys.signing, "bob", 60, issuer=ISS, audience=AUD)
    assert _verifier(tmp_path).verify(old_token).principal == "alice"
    assert _verifier(tmp_path).verify(new_token).kid == "k2"
    # The old key leaves the directory (its public half stays elsewhere): refused.
    (tmp_path / "k1.pem").unlink()
    with pytest.raises(UnauthenticatedError, match="unknown key id"):
        _verifier(tmp_path).verify(old_token)
    # A public-only key verifies.
    (tmp_path / "k1.pub.pem").write_bytes(public_pem(old))
    assert _verifier(tmp_path).verify(old_token).principal == "alice"
    signing = load_keys(tmp_path).signing
    assert signing is not None
    assert public_pem(signing) == public_pem(new)


def test_api_key_is_stored_hashed_and_checked(tmp_path: Path) -> None:
    key_id, api_key, digest = new_api_key()
    assert parse_api_key(api_key)[0] == key_id
    secret = parse_api_key(api_key)[1]
    assert secret not in digest
    assert api_key not in digest
    record = ApiKeyRecord(id=key_id, principal="svc", secret_sha256=digest, created_ms=0)
    check_secret(record, secret, now_ms=1)
    with pytest.raises(UnauthenticatedError):
        check_secret(record, secret[:-1] + ("A" if secret[-1] != "A" else "B"), now_ms=1)
    expiring = record.model_copy(update={"expires_ms": 10})
    with pytest.raises(UnauthenticatedError, match="expired"):
        check_secret(expiring, secret, now_ms=10)
    with pytest.raises(UnauthenticatedError):
        parse_api_key("dnbk_nothex_x")


ORDERS = Resource.topic(TopicName("shop", "orders"))
PAYMENTS = Resource.topic(TopicName("shop", "payments"))
OTHER_NS = Resource.topic(TopicName("other", "orders"))


def _policy(scope: str, resource: str) -> Policy:
    return Policy.of(
        [Role(name="writer", permissions=[P.Produce, P.Lookup])],
        [Binding(id="b1", principal="alice", roles=["writer"], scope=scope, resource=resource)],
    )


@pytest.mark.parametrize(
    ("scope", "resource", "allowed"),
    [
        ("cluster", "", {ORDERS, PAYMENTS, OTHER_NS}),
        ("namespace", "shop", {ORDERS, PAYMENTS}),
        ("topic", "/shop/orders", {ORDERS}),
    ],
)
def test_binding_reaches_its_scope_and_below_only(
    scope: str, resource: str, allowed: set[Resource]
) -> None:
    policy = _policy(scope, resource)
    for target in (ORDERS, PAYMENTS, OTHER_NS):
        assert decide(policy, "alice", P.Produce, target).allowed == (target in allowed)
        assert not decide(policy, "alice", P.Consume, target).allowed  # not in the role
        assert not decide(policy, "bob", P.Produce, target).allowed  # not bound
    partition = Resource.topic(TopicName("shop", "orders-part-3"))
    assert partition == ORDERS


def test_default_deny_and_super_admin() -> None:
    policy = Policy()
    decision = decide(policy, "alice", P.ManageCluster, Resource.cluster())
    assert not decision.allowed
    assert "ManageCluster" in decision.reason
    admin = decide(
        policy, "root", P.ManageCluster, Resource.cluster(), super_admins=frozenset({"root"})
    )
    assert admin.allowed


def test_deleting_a_binding_or_role_takes_the_grant_away() -> None:
    policy = _policy("namespace", "shop")
    assert decide(policy, "alice", P.Produce, ORDERS).allowed
    policy.delete_role("writer")
    assert not decide(policy, "alice", P.Produce, ORDERS).allowed
    policy = _policy("namespace", "shop")
    policy.delete_binding("b1")
    assert not decide(policy, "alice", P.Produce, ORDERS).allowed
    assert policy.bindings_of("alice", ORDERS) == []


def test_a_principals_own_bindings_and_what_they_grant() -> None:
    policy = _policy("namespace", "shop")
    policy.put_binding(Binding(id="b0", principal="alice", roles=["gone"], scope="cluster"))
    policy.put_binding(Binding(id="b2", principal="bob", roles=["writer"], scope="cluster"))
    assert [b.id for b in policy.bindings_for("alice")] == ["b0", "b1"]
    assert policy.permissions_of(policy.bindings["b0"]) == []  # a role that does not exist
    assert policy.permissions_of(policy.bindings["b1"]) == [P.Lookup, P.Produce]


def test_the_gate_answers_questions_without_counting_them(tmp_path: Path) -> None:
    assert SecurityGate.disabled().permissions("anyone", ORDERS) == list(Permission)
    assert SecurityGate.disabled().grants("anyone") == []
    generate_key(tmp_path)
    verifier = TokenVerifier(load_keys(tmp_path).public, issuer="i", audience="a")
    counters = AdmissionCounters.unregistered()
    gate = SecurityGate(
        SecurityConfig(enabled=True), verifier=verifier, authz_denied=counters.authz_denied
    )
    gate.policy = _policy("namespace", "shop")
    assert gate.permissions("alice", ORDERS) == [P.Lookup, P.Produce]
    assert gate.permissions("alice", OTHER_NS) == []
    assert gate.permissions("alice", Resource.cluster()) == []
    assert not gate.decision("alice", P.Produce, OTHER_NS).allowed
    assert counters.authz_denied.labels("Produce")._value.get() == 0
    assert [(b.id, p) for b, p in gate.grants("alice")] == [("b1", [P.Lookup, P.Produce])]
    with pytest.raises(PermissionDeniedError):  # a request refused is counted where told
        gate.authorize("alice", P.Produce, OTHER_NS, action="test")
    assert counters.authz_denied.labels("Produce")._value.get() == 1


def test_the_console_offers_every_permission_and_no_other() -> None:
    source = load_static()["app.js"][0].decode()
    listed = re.search(r"const PERMISSIONS = \[(.*?)\];", source, re.S)
    assert listed is not None
    assert re.findall(r'"(\w+)"', listed.group(1)) == [p.value for p in Permission]


def test_every_http_route_has_a_permission_rule() -> None:
    app = build_app(object(), max_body_bytes=1 << 20)  # type: ignore[arg-type]
    served: set[tuple[str, str]] = set()
    routes = list(app.routes)
    for route in routes:
        if hasattr(route, "original_router"):  # an included router (FastAPI 0.16x)
            routes.extend(route.original_router.routes)
        elif isinstance(route, APIRoute):
            served |= {(method, route.path) for method in route.methods or ()}
        elif isinstance(route, APIWebSocketRoute):
            served.add(("WEBSOCKET", route.path))
    served = {(m, p.replace(":int", "")) for m, p in served}
    ruled = set(ROUTES) | PUBLIC | AUTHENTICATED | PER_TOPIC
    assert served - ruled == set()
    assert ruled - served == set()  # no stale rule either


class _Anything:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def test_every_grpc_method_has_a_permission_rule() -> None:
    handlers = method_handlers(_Anything(), _Anything(), 1.0)  # type: ignore[arg-type]
    # grpc's generic handler keeps them by full path: "/<service>/<method>".
    served = {path.removeprefix("/") for h in handlers for path in h._method_handlers}
    assert served == set(METHODS)
