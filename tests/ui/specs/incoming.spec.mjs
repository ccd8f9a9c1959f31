// The incoming direction and the relay on the dashboard, against the running stack: a GitHub
// Source created through the API, a signed webhook sent to its ingress URL, the Incoming Event
// with its Forwards on the pages; the relay page with the slot and its lag.
import crypto from "node:crypto";
import { test, expect } from "@playwright/test";
import { nav, seeded, signIn, expectAccessible, screenshot, operatorToken, receiver } from "./helpers.mjs";

test.describe.configure({ mode: "serial" });

const base = () => process.env.RAILHOOK_UI_BASE;
const SECRET = "ui-test-github-secret";

async function api(request, method, url, body) {
  const res = await request.fetch(base() + url, {
    method,
    headers: { authorization: `Bearer ${seeded().key}`, "content-type": "application/json" },
    data: body === undefined ? undefined : JSON.stringify(body),
  });
  expect(res.ok(), `${method} ${url}: ${res.status()} ${await res.text()}`).toBeTruthy();
  return res.json();
}

/** A GitHub-signed webhook (X-Hub-Signature-256 over the raw body) to an ingress path. */
async function sendGithub(request, ingressPath, delivery, body) {
  const raw = JSON.stringify(body);
  const signature = "sha256=" + crypto.createHmac("sha256", SECRET).update(raw).digest("hex");
  const res = await request.post(base() + ingressPath, {
    headers: { "content-type": "application/json", "x-hub-signature-256": signature, "x-github-delivery": delivery, "x-github-event": "push" },
    data: raw,
  });
  expect(res.status(), await res.text()).toBeLessThan(300);
}

let source;

test("a signed webhook at a Source's ingress URL: the Incoming Event and its Forwards", async ({ page, request }) => {
  source = await api(request, "POST", "/v1/sources", { name: "GitHub repo", provider: "github", secret: SECRET });
  await api(request, "POST", `/v1/sources/${source.id}/destinations`, { url: `${receiver()}/ok/incoming` });
  await api(request, "POST", `/v1/sources/${source.id}/destinations`, { url: `${receiver()}/gone/incoming` });
  const delivery = crypto.randomUUID();
  await sendGithub(request, source.ingress_path, delivery, { ref: "refs/heads/main", commits: 3 });

  await signIn(page, seeded().key);
  await nav(page, "Sources").click();
  const row = page.locator("tbody tr", { hasText: source.id });
  await expect(row).toContainText("github");
  await expect(row).toContainText("enabled");
  await expect(row).toContainText(source.ingress_path);
  await expectAccessible(page);
  await screenshot(page, "sources");

  await row.getByRole("link").first().click();
  await expect(page.getByRole("heading", { level: 1 })).toContainText(source.id);
  await expect(page.locator("tbody tr")).toHaveCount(2);
  await expectAccessible(page);
  await screenshot(page, "source");

  await nav(page, "Incoming Events").click();
  await page.getByLabel("Provider event id").fill(delivery);
  await page.getByRole("button", { name: "Filter" }).click();
  await expect(page.locator("tbody tr")).toHaveCount(1);
  await expectAccessible(page);
  await screenshot(page, "incoming-events");

  await page.locator("tbody tr").first().getByRole("link").first().click();
  await expect(page.getByLabel("Request headers")).toContainText(`x-github-delivery: ${delivery}`);
  await expect(page.getByLabel("Request body")).toContainText('"commits":3');
  const forwards = page.locator("section.attempt");
  await expect(forwards).toHaveCount(2);
  // The page reloads itself while a Forward is in flight.
  await expect(forwards.filter({ hasText: "SUCCESS" })).toHaveCount(1, { timeout: 30_000 });
  await expect(forwards.filter({ hasText: "FAILED" })).toHaveCount(1, { timeout: 30_000 });
  await expect(forwards.filter({ hasText: "SUCCESS" }).locator("tbody tr").first()).toContainText("200");
  await expect(forwards.filter({ hasText: "FAILED" }).locator("tbody tr").first()).toContainText("404");
  await expectAccessible(page);
  await screenshot(page, "incoming-event");
});

test("a failed Forward is retried from the list", async ({ page }) => {
  await signIn(page, seeded().key);
  await nav(page, "Failed Forwards").click();
  const rows = page.locator("tbody tr");
  await expect(rows).toHaveCount(1);
  await expectAccessible(page);
  await screenshot(page, "failed-forwards");
  const forwardId = (await rows.first().locator("td code").first().textContent()).trim();
  const attemptsBefore = Number((await rows.first().locator("td").nth(4).textContent()).trim());
  await rows.first().getByRole("checkbox").check();
  await page.getByRole("button", { name: "Retry selected" }).click();
  await expect(page.getByRole("status")).toContainText("1 put back on the Retry Ladder");
  // The retry made a new Attempt. The Destination still answers 404, so the Forward may be
  // back on this list (FAILED again) by the time the page renders, or still on its way.
  await expect
    .poll(async () => {
      await page.goto("/ui/failed-forwards");
      const row = page.locator("tbody tr", { hasText: forwardId });
      return (await row.count()) === 0 ? null : Number((await row.locator("td").nth(4).textContent()).trim());
    }, { timeout: 30_000 })
    .toBe(attemptsBefore + 1);
});

test("the relay page: the slot, and its position moving after Events", async ({ page, request }) => {
  await signIn(page, operatorToken());
  await nav(page, "Relay").click();
  await expect(page.getByRole("heading", { name: "Relay" })).toBeVisible();
  await expect(page.locator(".facts")).toContainText("rh_slot_ui_");
  await expect(page.locator(".facts")).toContainText("active");
  await expect(page.locator("#lag-bytes")).toHaveText(/\d+ (B|KiB|MiB|GiB)/);
  const lsnBefore = (await page.locator("#current-lsn").textContent()).trim();
  const lagBefore = await page.locator("#lag-bytes").getAttribute("data-bytes");
  for (let i = 0; i < 20; i++) {
    await api(request, "POST", "/v1/events", { type: "order.paid", payload: { order: `relay_${i}`, pad: "x".repeat(2000) } });
  }
  // The chart fills from the dashboard's own samples (every 5 s).
  await expect(async () => {
    await page.reload();
    expect(Number(await page.locator("#lag-chart").getAttribute("data-samples"))).toBeGreaterThanOrEqual(2);
  }).toPass({ timeout: 30_000 });
  const lsnAfter = (await page.locator("#current-lsn").textContent()).trim();
  const lagAfter = await page.locator("#lag-bytes").getAttribute("data-bytes");
  expect(lsnAfter).not.toBe(lsnBefore);
  console.log(`relay page: lsn ${lsnBefore} -> ${lsnAfter}, lag ${lagBefore} -> ${lagAfter} bytes`);
  expect(lagAfter).toMatch(/^\d+$/);
  await expectAccessible(page);
  await screenshot(page, "relay");
});
