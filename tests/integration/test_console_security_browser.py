"""The admin console with security on, in Debian's chromium (Playwright) on a secured
in-process mesh: without a token the page asks for one (and says when one is refused); a
principal holding only Consume and Lookup on one topic sees no create or delete button, no
produce form and no security page, and peeks; the super-admin sees the security page, creates
a role and a binding from it and deletes a binding, and the API lists what the page did."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from tests.integration.conftest import MeshSettings
from tests.integration.test_console_browser import browser, open_page
from tests.integration.test_security_api import ADMIN, secured_mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

__all__ = ["browser"]  # the fixture, shared with the security-off test


async def _sign_in(page: Page, token: str) -> None:
    await expect(page.locator("#login")).to_be_visible()
    await page.fill("#login-token", token)
    await page.click("#login-submit")


async def test_console_asks_for_a_token_and_shows_only_what_the_principal_may(
    mesh_settings: MeshSettings, browser: Browser, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with secured_mesh(mesh_settings, tmp_path) as mesh, mesh.client(ADMIN) as root:
        await root.admin.create_topic("/default/orders")
        produced = await mesh.http.post(
            "/v1/topics/default/orders/messages",
            json={"messages": [{"payload": f'{{"order": {i}}}'} for i in range(2)]},
            headers=mesh.auth(ADMIN),
        )
        assert produced.status_code == 200, produced.text
        await root.security.create_role("reader", ["Consume", "Lookup"])
        await root.security.create_binding(
            "reader-orders",
            principal="reader",
            roles=["reader"],
            scope="topic",
            resource="/default/orders",
        )
        page, dialogs = await open_page(browser)

        # No token: a sign-in prompt, not the pages.
        await page.goto(f"{mesh.base_url}/console")
        await expect(page.locator("#login-reason")).to_contain_text("Security is on")
        await expect(page.locator("header nav")).to_be_hidden()
        await expect(page.locator("#error")).to_be_hidden()
        await page.screenshot(path=str(shots / "console-login.png"))
        # A token the cluster does not accept: asked again, with why.
        await _sign_in(page, "not-a-token")
        await expect(page.locator("#login-reason")).to_contain_text("The token was refused")

        # The reader: its access, no management, no security page; peek works.
        await _sign_in(page, mesh.token("reader"))
        await expect(page.locator("#principal")).to_have_text("as reader")
        await expect(page.locator('#grants-table tr[data-grant="reader-orders"]')).to_contain_text(
            "Lookup, Consume"
        )
        for hidden in ("security", "cluster", "namespaces", "schemas"):
            await expect(page.locator(f'header nav a[data-page="{hidden}"]')).to_be_hidden()
        await expect(page.locator('header nav a[data-page="topics"]')).to_be_visible()
        await page.click('#grants-table a:text("/default/orders")')
        await expect(page.locator("h1")).to_have_text("/default/orders ")
        await expect(page.locator("#describe-denied")).to_be_visible()
        await page.fill("#peek-count", "5")
        await page.click("#peek-button")
        peeked = page.locator("#peek-table tbody tr")
        await expect(peeked).to_have_count(2)
        await expect(peeked.nth(0).locator("pre")).to_have_text('{\n  "order": 1\n}')
        assert await page.locator("#delete-topic").count() == 0
        assert await page.locator("#produce-form").count() == 0
        await expect(page.locator("#error")).to_be_hidden()  # nothing it may not do was asked
        await page.screenshot(path=str(shots / "console-reader.png"))
        await page.goto(f"{mesh.base_url}/console#/topics/default")
        await expect(page.locator("#topics-denied")).to_contain_text("needs ManageTopic")
        await expect(page.locator("#granted-topics")).to_contain_text("/default/orders")
        assert await page.locator("#create-topic").count() == 0

        # The super-admin: every page; roles and bindings made from the security page.
        await page.click("#token-clear")
        await _sign_in(page, mesh.token(ADMIN))
        await expect(page.locator("#create-topic")).to_be_visible()  # back where it was
        await page.click('header nav a[data-page="cluster"]')
        await expect(page.locator("#card-controller")).to_have_text("disc-1")
        await page.click('header nav a[data-page="security"]')
        await expect(page.locator('#roles-table tr[data-role="reader"]')).to_contain_text(
            "Consume, Lookup"
        )
        await expect(
            page.locator('#bindings-table tr[data-binding="reader-orders"]')
        ).to_contain_text("/default/orders")
        await page.fill("#role-name", "auditor")
        for permission in ("Lookup", "ManageTopic"):
            await page.check(f'#role-form input[data-permission="{permission}"]')
        await page.click("#create-role")
        await expect(page.locator("#notice")).to_have_text(
            "role auditor saved: Lookup, ManageTopic"
        )
        await expect(page.locator('#roles-table tr[data-role="auditor"]')).to_be_visible()
        await page.fill("#binding-id", "auditor-default")
        await page.fill("#binding-principal", "aud")
        await page.select_option("#binding-roles", ["auditor"])
        await page.select_option("#binding-scope", "namespace")
        await page.fill("#binding-resource", "default")
        await page.click("#create-binding")
        await expect(page.locator("#notice")).to_have_text(
            "binding auditor-default saved: aud has auditor on namespace default"
        )
        roles = {r.name: r.permissions for r in await root.security.roles()}
        assert roles["auditor"] == ["Lookup", "ManageTopic"]
        made = {b.id: b for b in await root.security.bindings()}
        assert made["auditor-default"].principal == "aud"
        assert made["auditor-default"].roles == ["auditor"]
        assert (made["auditor-default"].scope, made["auditor-default"].resource) == (
            "namespace",
            "default",
        )
        # The grant is live: the new principal may list the namespace's topics.
        listed = await mesh.http.get("/v1/namespaces/default/topics", headers=mesh.auth("aud"))
        assert listed.status_code == 200, listed.text
        await page.screenshot(path=str(shots / "console-security.png"))
        # Delete the reader's binding from the page, after a confirmation: its grant ends.
        await page.click('#bindings-table tr[data-binding="reader-orders"] .delete-binding')
        await expect(page.locator("#notice")).to_have_text("binding reader-orders deleted")
        await expect(
            page.locator('#bindings-table tr[data-binding="reader-orders"]')
        ).to_have_count(0)
        assert "reader-orders" not in {b.id for b in await root.security.bindings()}
        assert any("Delete binding reader-orders" in d for d in dialogs)
        peek = await mesh.http.get("/v1/topics/default/orders/peek", headers=mesh.auth("reader"))
        assert peek.status_code == 403
        await page.close()
