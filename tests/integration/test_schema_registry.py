"""The schema registry over HTTP on real etcd and discovery: registration (same definition
twice is one version; a new version; an incompatible one is 409 naming the rule; an invalid
one is 400 saying where), reads by subject and id, modes, soft delete, topic bindings, the
SDK, the CLI, and concurrent registrations never handing out one version twice."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from danube.client import AsyncDanubeClient, ConflictError, DanubeClient, NotFoundError
from danube.discovery.schemas.registry import SchemaRegistry
from danube.errors import DanubeError
from danube.meta import MetaStore, TopicName

pytestmark = pytest.mark.integration

DANUBE = str(Path(sys.executable).parent / "danube")
COMMAND_TIMEOUT_S = 60.0


def _avro(*extra: dict[str, Any]) -> str:
    fields = [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}, *extra]
    return json.dumps({"type": "record", "name": "User", "namespace": "acme", "fields": fields})


async def _register(
    http: httpx.AsyncClient, subject: str, schema: str, **kw: Any
) -> httpx.Response:
    body = {"schema_type": kw.pop("schema_type", "avro"), "schema": schema, **kw}
    return await http.post(f"/v1/schemas/{subject}/versions", json=body)


async def test_register_versions_compatibility_and_reads(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    first = await _register(http, "users-value", _avro(), description="v1", tags=["team-a"])
    assert first.status_code == 201, first.text
    v1 = first.json()
    assert v1["version"] == 1
    assert v1["is_new_version"] is True
    assert len(v1["fingerprint"]) == 64

    # The same definition, spelled differently: the same id and version, nothing new.
    respelled = json.dumps(json.loads(_avro()), indent=2)
    again = await _register(http, "users-value", respelled)
    assert again.status_code == 200
    assert again.json() == {**v1, "is_new_version": False}

    # Backward (the default): a field without a default is refused, naming the rule.
    bad = await _register(http, "users-value", _avro({"name": "age", "type": "int"}))
    assert bad.status_code == 409
    error = bad.json()["error"]
    assert error["code"] == "incompatible_schema"
    assert "reader_field_missing_default at $.age" in error["message"]

    good = await _register(http, "users-value", _avro({"name": "age", "type": "int", "default": 0}))
    assert good.status_code == 201
    v2 = good.json()
    assert (v2["schema_id"], v2["version"]) == (v1["schema_id"], 2)

    # Another subject gets another id.
    other = await _register(http, "orders-value", "", schema_type="string")
    assert other.status_code == 201
    assert other.json()["schema_id"] != v1["schema_id"]

    latest = (await http.get("/v1/schemas/users-value/versions/latest")).json()
    assert latest["version"] == 2
    assert latest["compatibility_mode"] == "backward"
    assert json.loads(latest["schema"])["fields"][2]["name"] == "age"
    by_id = (await http.get(f"/v1/schemas/ids/{v1['schema_id']}", params={"version": 1})).json()
    assert (by_id["subject"], by_id["version"], by_id["description"]) == ("users-value", 1, "v1")
    assert by_id["tags"] == ["team-a"]
    listed = (await http.get("/v1/schemas/users-value/versions")).json()
    assert [v["version"] for v in listed["versions"]] == [1, 2]
    assert (await http.get("/v1/schemas")).json()["subjects"] == ["orders-value", "users-value"]

    check = await http.post(
        "/v1/schemas/users-value/compatibility",
        json={"schema_type": "avro", "schema": _avro({"name": "age", "type": "string"})},
    )
    assert check.status_code == 200
    assert check.json()["compatible"] is False
    assert "type_mismatch at $.age" in check.json()["errors"][0]

    # Mode none lets it through; versions stay immutable and numbered on.
    put = await http.put("/v1/schemas/users-value/mode", json={"mode": "none"})
    assert put.json() == {"subject": "users-value", "mode": "none"}
    assert (await http.get("/v1/schemas/users-value/mode")).json()["mode"] == "none"
    v3 = await _register(http, "users-value", _avro({"name": "age", "type": "string"}))
    assert v3.status_code == 201
    assert v3.json()["version"] == 3

    # Soft delete: gone from latest and the list, still readable by version.
    assert (await http.delete("/v1/schemas/users-value/versions/3")).status_code == 204
    assert (await http.get("/v1/schemas/users-value/versions/latest")).json()["version"] == 2
    gone = await http.get("/v1/schemas/users-value/versions/3")
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "schema_not_found")
    deleted = await http.get("/v1/schemas/users-value/versions/3", params={"deleted": "true"})
    assert deleted.json()["deleted"] is True
    by_id = await http.get(f"/v1/schemas/ids/{v1['schema_id']}", params={"version": 3})
    assert (by_id.json()["version"], by_id.json()["deleted"]) == (3, True)
    again3 = await _register(http, "users-value", _avro({"name": "age", "type": "string"}))
    assert again3.json()["version"] == 4  # never reused


@pytest.mark.parametrize(
    ("schema_type", "schema", "where"),
    [
        (
            "avro",
            '{"type":"record","name":"U","fields":[{"name":"a","type":"nope"}]}',
            "$.fields[0].type",
        ),
        ("json_schema", '{"type": "object", "required": "id"}', "$.required"),
        ("protobuf", 'syntax = "proto3";\nmessage A { int32 a = 1 }\n', "schema.proto:2:25"),
    ],
)
async def test_invalid_definitions_are_400_with_the_location(
    consume_http: httpx.AsyncClient, schema_type: str, schema: str, where: str
) -> None:
    answer = await _register(consume_http, "bad", schema, schema_type=schema_type)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid_schema"
    assert f"at {where}:" in error["message"]
    assert (await consume_http.get("/v1/schemas/bad/versions")).status_code == 404


async def test_bad_requests(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    answer = await _register(http, "a%2Fb", "")
    assert answer.status_code in (400, 404)
    answer = await _register(http, "has space", "", schema_type="string")
    assert answer.json()["error"]["code"] == "invalid_name"
    answer = await http.post("/v1/schemas/s/versions", json={"schema_type": "xml", "schema": ""})
    assert answer.status_code == 400
    big = await _register(http, "s", "x" * (256 * 1024 + 1), schema_type="string")
    assert big.status_code == 400  # over the field's max_length
    unknown = await http.get("/v1/schemas/nobody/versions/latest")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "subject_not_found")
    no_id = await http.get("/v1/schemas/ids/999999")
    assert (no_id.status_code, no_id.json()["error"]["code"]) == (404, "schema_not_found")
    mode = await http.put("/v1/schemas/nobody/mode", json={"mode": "sideways"})
    assert mode.status_code == 400
    # /versions/latest is not a version number: other methods are 405, and Allow says GET.
    latest = await http.delete("/v1/schemas/s/versions/latest")
    assert (latest.status_code, latest.headers["allow"]) == (405, "GET")
    fresh = await http.post(
        "/v1/schemas/fresh/compatibility", json={"schema_type": "string", "schema": ""}
    )
    assert fresh.json() == {"compatible": True, "mode": "backward", "errors": []}


async def test_topic_binding(consume_http: httpx.AsyncClient) -> None:
    http = consume_http
    schema = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}})
    registered = await _register(http, "events", schema, schema_type="json_schema")
    schema_id = registered.json()["schema_id"]
    missing = await http.get("/v1/topics/default/events/schema")
    assert missing.json()["error"]["code"] == "topic_schema_not_found"
    no_subject = await http.put("/v1/topics/default/events/schema", json={"subject": "nope"})
    assert no_subject.json()["error"]["code"] == "subject_not_found"

    body = {"subject": "events", "validation_policy": "enforce", "payload_validation": True}
    put = await http.put("/v1/topics/default/events/schema", json=body)
    assert put.status_code == 200
    got = (await http.get("/v1/topics/default/events/schema")).json()
    assert {k: got[k] for k in ("topic", "subject", "schema_id", "validation_policy")} == {
        "topic": "/default/events",
        "subject": "events",
        "schema_id": schema_id,
        "validation_policy": "enforce",
    }
    assert got["payload_validation"] is True
    patched = await http.patch(
        "/v1/topics/default/events/schema",
        json={"validation_policy": "warn", "payload_validation": False},
    )
    assert (patched.json()["validation_policy"], patched.json()["payload_validation"]) == (
        "warn",
        False,
    )
    # The last live version of a bound subject cannot go.
    in_use = await http.delete("/v1/schemas/events/versions/1")
    assert (in_use.status_code, in_use.json()["error"]["code"]) == (409, "schema_in_use")
    assert (await http.delete("/v1/topics/default/events/schema")).status_code == 204
    assert (await http.delete("/v1/schemas/events/versions/1")).status_code == 204


async def test_concurrent_registrations_get_distinct_versions(
    consume_http: httpx.AsyncClient,
) -> None:
    url = str(consume_http.base_url)
    async with AsyncDanubeClient(url) as client:
        await client.schemas.register("race", "avro", _avro())
        await client.schemas.set_mode("race", "none")
        defs = [_avro({"name": f"f{i}", "type": "int", "default": i}) for i in range(8)]
        done = await asyncio.gather(*(client.schemas.register("race", "avro", d) for d in defs))
        assert sorted(r.version for r in done) == list(range(2, 10))
        assert {r.schema_id for r in done} == {done[0].schema_id}
        versions = await client.schemas.versions("race")
        assert [v.version for v in versions] == list(range(1, 10))
        await client.schemas.set_mode("race", "backward")
        with pytest.raises(ConflictError) as caught:
            await client.schemas.register("race", "avro", _avro({"name": "x", "type": "int"}))
        assert caught.value.code == "incompatible_schema"


def _sync_round_trip(url: str) -> None:
    with DanubeClient(url) as client:
        proto = (
            'syntax = "proto3";\npackage acme;\nmessage Tick { int64 at = 1; double price = 2; }\n'
        )
        done = client.schemas.register("ticks", "protobuf", proto, tags=["market"])
        assert (done.version, done.is_new_version) == (1, True)
        latest = client.schemas.latest("ticks")
        assert (latest.definition, latest.tags, latest.schema_type) == (
            proto,
            ["market"],
            "protobuf",
        )
        assert client.schemas.get(done.schema_id).fingerprint == done.fingerprint
        changed = proto.replace("double price", "string price")
        found = client.schemas.check("ticks", "protobuf", changed)
        assert not found.compatible
        assert found.errors == [
            "version 1: field_wire_type_changed at acme.Tick.price (field 2): 64-bit -> "
            "length-delimited"
        ]
        bound = client.schemas.bind_topic("/default/ticks", "ticks", validation_policy="warn")
        assert (bound.subject, bound.schema_id) == ("ticks", done.schema_id)
        client.schemas.unbind_topic("/default/ticks")
        with pytest.raises(NotFoundError) as caught:
            client.schemas.topic_schema("/default/ticks")
        assert caught.value.code == "topic_schema_not_found"


async def test_blocking_client_round_trip(consume_http: httpx.AsyncClient) -> None:
    await asyncio.to_thread(_sync_round_trip, str(consume_http.base_url))


async def _danube(*args: str) -> tuple[int, str, str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("DANUBE_SERVICE_ADDR", None)
    process = await asyncio.create_subprocess_exec(
        DANUBE,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    async with asyncio.timeout(COMMAND_TIMEOUT_S):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_cli_round_trip(consume_http: httpx.AsyncClient, tmp_path: Path) -> None:
    url = str(consume_http.base_url).rstrip("/")
    v1 = tmp_path / "v1.avsc"
    v1.write_text(_avro())
    v2 = tmp_path / "v2.avsc"
    v2.write_text(_avro({"name": "age", "type": "int"}))
    code, out, err = await _danube(
        "schemas",
        "register",
        "cli-users",
        "--type",
        "avro",
        "--file",
        str(v1),
        "--created-by",
        "me",
        "-s",
        url,
        "--json",
    )
    assert code == 0, err
    registered = json.loads(out)
    assert registered["version"] == 1
    assert registered["is_new_version"] is True
    code, out, _ = await _danube(
        "schemas", "register", "cli-users", "--type", "avro", "--file", str(v1), "-s", url
    )
    assert (code, out.strip()) == (
        0,
        f"cli-users: already registered as version 1 (schema id {registered['schema_id']})",
    )
    code, out, _ = await _danube(
        "schemas", "check", "cli-users", "--type", "avro", "--file", str(v2), "-s", url
    )
    assert code == 1
    assert "incompatible (backward)" in out
    assert "reader_field_missing_default at $.age" in out
    code, _, err = await _danube(
        "schemas", "register", "cli-users", "--type", "avro", "--file", str(v2), "-s", url
    )
    assert code == 1
    assert "incompatible_schema" in err
    code, out, _ = await _danube("schemas", "mode", "cli-users", "--set", "forward", "-s", url)
    assert (code, out.strip()) == (0, "forward")
    code, out, _ = await _danube(
        "schemas", "register", "cli-users", "--type", "avro", "--file", str(v2), "-s", url
    )
    assert code == 0
    assert "registered version 2" in out
    code, out, _ = await _danube("schemas", "versions", "cli-users", "-s", url, "--json")
    assert [v["version"] for v in json.loads(out)] == [1, 2]
    code, out, _ = await _danube(
        "schemas",
        "get",
        "--id",
        str(registered["schema_id"]),
        "--version",
        "1",
        "-s",
        url,
        "--json",
    )
    assert json.loads(out)["created_by"] == "me"
    assert json.loads(json.loads(out)["schema"]) == json.loads(_avro())
    code, out, _ = await _danube(
        "admin",
        "topics",
        "schema",
        "set",
        "/default/cli-topic",
        "--subject",
        "cli-users",
        "--policy",
        "enforce",
        "--validate",
        "-s",
        url,
    )
    assert code == 0, out
    code, out, _ = await _danube(
        "admin", "topics", "schema", "get", "/default/cli-topic", "-s", url, "--json"
    )
    got = json.loads(out)
    assert (got["subject"], got["validation_policy"], got["payload_validation"]) == (
        "cli-users",
        "enforce",
        True,
    )
    code, _, err = await _danube("schemas", "delete", "cli-users", "--version", "2", "-s", url)
    assert code == 0
    assert "deleted" in err
    code, out, _ = await _danube("schemas", "get", "cli-users", "-s", url, "--json")
    assert json.loads(out)["version"] == 1


async def test_registry_interface_on_etcd(store: MetaStore) -> None:
    """The Python interface the produce path and the gRPC front door call, on etcd alone."""
    registry = SchemaRegistry(store, default_mode="full")
    schema = json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    )
    first = await registry.register("metrics", "JSON", schema.encode(), created_by="lead")
    again = await registry.register("metrics", "json_schema", schema.encode())
    assert (first.schema_id, first.version, first.is_new) == (again.schema_id, 1, True)
    assert again.is_new is False
    found = await registry.get(first.schema_id)
    assert (found.subject, found.schema_type, found.compatibility_mode) == (
        "metrics",
        "json_schema",
        "full",
    )
    check = await registry.validator(found)
    assert check(b'{"n": 3}') is None
    assert check(b'{"m": 3}') == "$: 'n' is a required property"
    assert await registry.validator(found) is check  # cached
    ok, errors = await registry.check("metrics", "json_schema", b'{"type": "string"}', "NONE")
    assert (ok, errors) == (True, [])
    ok, errors = await registry.check("metrics", "json_schema", b'{"type": "string"}')
    assert not ok
    assert errors[0].startswith("version 1 (backward): type_narrowed at $")
    topic = TopicName("default", "metrics")
    assert await registry.topic_schema(topic) is None
    bound = await registry.bind_topic(
        topic, "metrics", validation_policy="ENFORCE", payload_validation=True
    )
    assert (bound.validation_policy, bound.schema_id) == ("enforce", first.schema_id)
    updated = await registry.update_topic_policy(
        topic, validation_policy="warn", payload_validation=False
    )
    assert await registry.topic_schema(topic) == updated
    with pytest.raises(DanubeError) as caught:
        await registry.bind_topic(topic, "nope", validation_policy="none", payload_validation=False)
    assert caught.value.code == "subject_not_found"
