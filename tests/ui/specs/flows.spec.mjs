// The dashboard's main flows against the running stack (see ../run and ../seed.mjs).
import { test, expect } from "@playwright/test";
import { nav, seeded, signIn, expectAccessible, screenshot, operatorToken, receiver } from "./helpers.mjs";

test.describe.configure({ mode: "serial" });

test("a wrong key is refused with a message, and the sign-in page is accessible", async ({ page }) => {
  await signIn(page, "rhk_not-a-real-key");
  await expect(page.getByRole("alert")).toContainText("not valid");
  await expect(page.getByLabel("Project API key or operator token")).toHaveAttribute("aria-invalid", "true");
  await expectAccessible(page);
  await screenshot(page, "sign-in");
});

test("sign in with the project key: the overview shows the last hour", async ({ page }) => {
  await signIn(page, seeded().key);
  await expect(page.getByRole("heading", { name: "Overview" })).toBeVisible();
  const card = (label) => page.locator(".card", { has: page.getByText(label, { exact: true }) });
  await expect(card("Failed Messages").locator("dd").first()).toHaveText("2");
  await expect(card("Delivery success rate").locator("dd").first()).toHaveText("60.0 %");
  await expect(card("End-to-end latency p50").locator("dd").first()).toHaveText(/\d+ (ms|s)/);
  await expect(nav(page, "Overview")).toHaveAttribute("aria-current", "page");
  await expectAccessible(page);
  await screenshot(page, "overview");
});

test("see a delivered Event and its Attempt", async ({ page }) => {
  const { key, orders } = seeded();
  await signIn(page, key);
  await nav(page, "Deliveries").click();
  await page.getByLabel("Status").selectOption("SUCCESS");
  await page.getByLabel("Endpoint").fill(orders);
  await page.getByRole("button", { name: "Filter" }).click();
  const rows = page.locator("table tbody tr");
  await expect(rows).toHaveCount(3);
  await expect(rows.first()).toContainText("order.paid");
  await expectAccessible(page);
  await screenshot(page, "deliveries");

  await rows.first().getByRole("link").first().click();
  await expect(page.getByRole("heading", { level: 1 })).toContainText("Delivery dlv_");
  const attempt = page.getByRole("region", { name: "Attempt 1" });
  await expect(attempt).toContainText("success");
  await expect(attempt).toContainText("HTTP 200");
  await expect(page.getByLabel("Request body")).toContainText('"order": "ord_');
  await attempt.getByText("Response").click();
  await expect(attempt.getByLabel("Response body")).toContainText('{"received":true}');
  await expectAccessible(page);
  await screenshot(page, "delivery");
});

test("filters by event type and refuses a malformed filter with a 400", async ({ page }) => {
  await signIn(page, seeded().key);
  await page.goto("/ui/deliveries?event_type=invoice.created");
  await expect(page.locator("table tbody tr")).toHaveCount(2);
  const bad = await page.goto("/ui/deliveries?endpoint_id=nope");
  expect(bad.status()).toBe(400);
  await expect(page.getByRole("alert")).toContainText("Endpoint");
});

test("find the failing Endpoint", async ({ page }) => {
  const { key, orders, billing } = seeded();
  await signIn(page, key);
  await nav(page, "Endpoints").click();
  const failing = page.locator(`tr[data-endpoint="${billing}"]`);
  await expect(failing.locator(".badge")).toHaveText("failing");
  await expect(failing.locator("td").nth(4)).toHaveText("2");
  await expect(page.locator(`tr[data-endpoint="${orders}"] .badge`)).toHaveText("healthy");
  await expectAccessible(page);
  await screenshot(page, "endpoints");
});

test("retry a Failed Message and watch it succeed", async ({ page, request }) => {
  const { key } = seeded();
  await signIn(page, key);
  await nav(page, "Failed Messages").click();
  const rows = page.locator("table tbody tr");
  await expect(rows).toHaveCount(2);
  await expectAccessible(page);
  await screenshot(page, "failed-messages");

  // The receiver works again; retry the first Failed Message only.
  expect((await request.post(`${receiver()}/control/heal`)).ok()).toBeTruthy();
  const id = (await rows.first().getByRole("link").textContent()).trim();
  await rows.first().getByRole("checkbox").check();
  await page.getByRole("button", { name: "Retry selected" }).click();
  await expect(page.getByRole("status")).toContainText("1 put back on the Retry Ladder");
  await expect(page.locator("table tbody tr")).toHaveCount(1);

  await page.goto(`/ui/deliveries/${id}`);
  // The page reloads itself while the Delivery is in flight.
  await expect(page.locator(".facts .badge").first()).toHaveText("SUCCESS", { timeout: 30_000 });
  await expect(page.getByRole("region", { name: "Attempt 2" })).toContainText("HTTP 200");
  await expect(page.getByRole("region", { name: "Attempt 1" })).toContainText("HTTP 400");
  await screenshot(page, "delivery-retried");
});

test("rotate an Endpoint's secret: shown once", async ({ page }) => {
  const { key, orders } = seeded();
  await signIn(page, key);
  await page.goto("/ui/endpoints");
  page.once("dialog", (d) => d.accept());
  await page.locator(`tr[data-endpoint="${orders}"]`).getByRole("button", { name: /Rotate/ }).click();
  await expect(page.getByRole("heading", { name: "Secret rotated" })).toBeVisible();
  await expect(page.getByLabel("New signing secret")).toHaveText(/^whsec_/);
  await expectAccessible(page);
});

test("the operator sees every project and chooses one", async ({ page }) => {
  const { projectName, projectId } = seeded();
  await signIn(page, operatorToken());
  await expect(page.getByRole("heading", { name: "Projects" })).toBeVisible();
  await expectAccessible(page);
  await screenshot(page, "projects");
  await page.getByRole("button", { name: `Show project ${projectName}` }).click();
  await expect(page.getByRole("heading", { name: "Overview" })).toBeVisible();
  await expect(page.locator(".who")).toContainText(projectId);
});

test("session cookie, CSP and CSRF", async ({ page, context }) => {
  await signIn(page, seeded().key);
  const response = await page.goto("/ui/");
  const csp = response.headers()["content-security-policy"];
  expect(csp).toContain("script-src 'self'");
  expect(csp).not.toContain("unsafe-inline");
  expect(await page.locator("script:not([src])").count()).toBe(0);
  const session = (await context.cookies()).find((c) => c.name === "rh_session");
  expect(session).toMatchObject({ httpOnly: true, sameSite: "Strict", path: "/ui" });
  // A form without this session's token is refused, even with the cookie.
  const forged = await page.request.post("/ui/failed-messages/retry", { form: { scope: "matching", csrf: "forged" } });
  expect(forged.status()).toBe(403);
  const crossSite = await page.request.post("/ui/sign-out", {
    form: { csrf: "x" },
    headers: { "sec-fetch-site": "cross-site" },
  });
  expect(crossSite.status()).toBe(403);
});

test("keyboard: skip link first, then the navigation; sign out", async ({ page }) => {
  await signIn(page, seeded().key);
  // The sign-in's navigation first: a Tab pressed before it lands on the sign-in page.
  await expect(page.getByRole("heading", { name: "Overview" })).toBeVisible();
  await page.keyboard.press("Tab");
  await expect(page.getByRole("link", { name: "Skip to content" })).toBeFocused();
  await page.keyboard.press("Tab");
  await expect(nav(page, "Overview")).toBeFocused();
  await page.keyboard.press("Tab");
  await page.keyboard.press("Enter");
  await expect(page.getByRole("heading", { name: "Deliveries" })).toBeVisible();
  await page.getByRole("button", { name: "Sign out" }).click();
  await expect(page).toHaveURL(/\/ui\/sign-in$/);
  await page.goto("/ui/endpoints");
  await expect(page).toHaveURL(/\/ui\/sign-in$/);
});
