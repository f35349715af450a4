"""The admin console in a real headless browser (Debian's chromium driven by Playwright) on
an in-process mesh: the cluster page lists the nodes; a topic is created, produced to from the
page, its rate chart moves and its backlog matches the API's; peek shows JSON pretty-printed
and binary as hex; a subscription is sought; the token goes out as a bearer header and an
API refusal is shown; schemas show a diff; the topic is deleted; a partitioned topic grows
from its page. Screenshots of each page at 1440x900 land in the test's temp dir."""

from __future__ import annotations

import base64
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import (
    Browser,
    Dialog,
    Page,
    Request,
    Route,
    ViewportSize,
    async_playwright,
    expect,
)

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
# Offline and quiet: no GPU, no QUIC, no update or sync traffic (the page loads nothing from
# elsewhere anyway).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT: ViewportSize = {"width": 1440, "height": 900}
WAIT_MS = 15_000
RATE_ABOVE_ZERO = re.compile(r"^(?!0$)[0-9.]+$")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if shutil.which("chromium") is None:
        pytest.fail("chromium is not installed: run `make browser` (Debian's package)")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


async def _api_backlog(http: httpx.AsyncClient, path: str) -> int:
    doc = (await http.get(f"/v1/topics/{path}")).json()
    return int(sum(s["backlog"] or 0 for s in doc["subscriptions"]))


async def open_page(browser: Browser) -> tuple[Page, list[str]]:
    """A console page that accepts every confirmation, and the messages it was asked."""
    page = await browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(WAIT_MS)
    expect.set_options(timeout=WAIT_MS)
    dialogs: list[str] = []

    async def accept(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        await dialog.accept()

    page.on("dialog", accept)
    return page, dialogs


async def _shot(page: Page, shots: Path, name: str) -> None:
    await page.screenshot(path=str(shots / f"console-{name}.png"))


async def test_console_drives_a_topic_through_the_public_api(
    consume_http: httpx.AsyncClient, browser: Browser, tmp_path: Path
) -> None:
    http = consume_http
    base = str(http.base_url).rstrip("/")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    page, dialogs = await open_page(browser)
    sent: list[dict[str, str]] = []

    def record(request: Request) -> None:
        if "/v1/" in request.url:
            sent.append(request.headers)

    page.on("request", record)
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.url))

    # Cluster: every node by kind, the controller.
    await page.goto(f"{base}/console")
    nodes = page.locator("#nodes-table")
    for node in ("ingest-1", "disp-1", "disc-1"):
        await expect(nodes.locator(f'tr[data-node="{node}"]')).to_be_visible()
    await expect(page.locator("#card-controller")).to_have_text("disc-1", timeout=WAIT_MS)
    await _shot(page, shots, "cluster")

    # Topics: create one from the page.
    await page.goto(f"{base}/console#/topics/default")
    await page.fill("#new-topic", "console-t")
    await page.click("#create-topic")
    await expect(page.locator("#notice")).to_have_text("topic /default/console-t created")
    await expect(page.locator('tr[data-topic="console-t"]')).to_be_visible()
    assert (await http.get("/v1/topics/default/console-t")).status_code == 200
    attach = await http.post(
        "/v1/topics/default/console-t/subscriptions/s/consumers",
        json={"name": "worker", "type": "exclusive", "start": "earliest"},
    )
    assert attach.status_code == 201, attach.text
    await _shot(page, shots, "topics")

    # Topic page: produce from the page; the rate chart moves, the backlog matches the API.
    await page.click('tr[data-topic="console-t"] a')
    await expect(page.locator("h1")).to_contain_text("/default/console-t")
    for i in range(3):
        await page.fill("#produce-payload", f'{{"hello": {i}}}')
        await page.click("#produce")
        await expect(page.locator("#notice")).to_have_text(
            f"produced at offset {i} of /default/console-t"
        )
        if i == 0:
            # A rate needs two known counters: the first produce gives the partition its
            # leader (before it the counter is unknown).
            await expect(page.locator("#card-messages")).to_have_text("1")
    # The chart's highest rate, drawn: no longer 0 (the page's CSP forbids evaluating
    # script strings, so attributes are what the test reads).
    await expect(page.locator("#chart-rate")).to_have_attribute("data-max", RATE_ABOVE_ZERO)
    await expect(page.locator("#chart-rate polyline")).to_have_count(1)
    assert await _api_backlog(http, "default/console-t") == 3
    await expect(page.locator("#card-backlog")).to_have_text("3")
    await expect(page.locator('tr[data-subscription="s"] .sub-backlog')).to_have_text("3")
    await expect(page.locator('tr[data-subscription="s"]')).to_contain_text("worker")
    await expect(page.locator("#partitions-table .wal-end")).to_have_text("3")

    # Binary from the page, then peek: JSON pretty-printed, binary as hex.
    await page.fill("#produce-payload", base64.b64encode(bytes([0xFF, 0x00, 0xFE])).decode())
    await page.select_option("#produce-encoding", "base64")
    await page.click("#produce")
    await expect(page.locator("#notice")).to_contain_text("produced at offset 3")
    await page.fill("#peek-count", "4")
    await page.click("#peek-button")
    peeked = page.locator("#peek-table tbody tr")
    await expect(peeked).to_have_count(4)
    await expect(peeked.nth(0).locator("pre")).to_contain_text("ff 00 fe")
    await expect(peeked.nth(0)).to_contain_text("hex")
    await expect(peeked.nth(1).locator("pre")).to_have_text('{\n  "hello": 2\n}')
    await expect(peeked.nth(1)).to_contain_text("json")
    # Peeking moved nothing.
    assert await _api_backlog(http, "default/console-t") == 4
    await expect(page.locator("#card-backlog")).to_have_text("4")
    await _shot(page, shots, "topic")

    # Seek the subscription to its end from the page: the backlog drops to 0 there and in
    # the API.
    row = page.locator('tr[data-subscription="s"]')
    await row.locator(".seek-kind").select_option("latest")
    await row.locator(".seek").click()
    await expect(page.locator("#notice")).to_have_text("cursor moved: /default/console-t → 4")
    assert await _api_backlog(http, "default/console-t") == 0
    await expect(page.locator('tr[data-subscription="s"] .sub-backlog')).to_have_text("0")
    await expect(page.locator("#card-backlog")).to_have_text("0")

    # A token is sent as a bearer header on every API call; a refusal's message is shown.
    await page.fill("#token", "secret-token")
    await page.click("#token-form button[type=submit]")
    await expect(page.locator("#token-state")).to_have_text("token set")
    sent.clear()
    await page.click("#peek-button")
    await expect(peeked).to_have_count(4)
    assert sent
    assert all(h.get("authorization") == "Bearer secret-token" for h in sent)

    async def refuse(route: Route) -> None:
        await route.fulfill(
            status=403,
            content_type="application/json",
            body='{"error": {"code": "forbidden", "message": "principal ops may not peek"}}',
        )

    await page.route("**/peek?*", refuse)
    await page.click("#peek-button")
    await expect(page.locator("#error")).to_have_text("403 forbidden: principal ops may not peek")
    await page.unroute("**/peek?*")
    await page.click("#token-clear")
    await expect(page.locator("#token-state")).to_have_text("no token")

    # Namespaces and schemas pages.
    await page.goto(f"{base}/console#/namespaces")
    await expect(page.locator('tr[data-namespace="default"]')).to_be_visible()
    await _shot(page, shots, "namespaces")
    definitions = [
        '{"type": "object",\n "properties": {\n  "a": {"type": "string"}\n }}',
        '{"type": "object",\n "properties": {\n  "a": {"type": "string"},\n'
        '  "b": {"type": "integer"}\n }}',
    ]
    for definition in definitions:
        registered = await http.post(
            "/v1/schemas/orders-value/versions",
            json={"schema_type": "json_schema", "schema": definition},
        )
        assert registered.status_code == 201, registered.text
    await page.goto(f"{base}/console#/schemas/orders-value")
    await expect(page.locator("#versions-table tbody tr")).to_have_count(2)
    # v1 -> v2: the line of "a" gained a comma, the line of "b" is new.
    await expect(page.locator("#diff .del")).to_have_text(['-   "a": {"type": "string"}'])
    await expect(page.locator("#diff .add")).to_have_text(
        ['+   "a": {"type": "string"},', '+   "b": {"type": "integer"}']
    )
    await expect(page.locator("#schema-mode")).to_have_value("backward")
    await _shot(page, shots, "schemas")

    # Delete the topic from its page, after the confirmation.
    await page.goto(f"{base}/console#/topic/default/console-t")
    await page.click("#delete-topic")
    await expect(page.locator("#notice")).to_have_text("topic /default/console-t deleted")
    await expect(page.locator("#topics-table")).to_be_visible()
    await expect(page.locator('tr[data-topic="console-t"]')).to_have_count(0)
    assert (await http.get("/v1/topics/default/console-t")).status_code == 404
    assert any("Delete topic /default/console-t" in d for d in dialogs)
    assert not [url for url in failed if not url.startswith(base)]
    assert sorted(p.name for p in shots.iterdir()) == [
        f"console-{n}.png" for n in ("cluster", "namespaces", "schemas", "topic", "topics")
    ]


async def test_console_grows_a_topic(consume_http: httpx.AsyncClient, browser: Browser) -> None:
    http = consume_http
    base = str(http.base_url).rstrip("/")
    assert (await http.put("/v1/topics/default/wide", json={"partitions": 2})).status_code == 201
    page, _ = await open_page(browser)
    await page.goto(f"{base}/console#/topic/default/wide")
    rows = page.locator("#partitions-table tbody tr")
    await expect(rows).to_have_count(2)
    await page.fill("#grow-count", "4")
    await page.click("#grow")
    await expect(page.locator("#notice")).to_have_text("/default/wide has 4 partitions")
    await expect(rows).to_have_count(4)
    assert (await http.get("/v1/topics/default/wide")).json()["config"]["partitions"] == 4
    # Fewer is refused, and said so.
    await page.fill("#grow-count", "3")
    await page.click("#grow")
    await expect(page.locator("#error")).to_contain_text("409 partitions_cannot_shrink")
    await expect(rows).to_have_count(4)
