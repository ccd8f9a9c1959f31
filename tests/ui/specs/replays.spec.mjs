// The Time Machine on the dashboard, against the running stack: a Replay estimated (dry run),
// started and watched until it completes with made == total, its Deliveries delivered; then a
// long one (2,000 Events) cancelled half-way, nothing made after the cancel.
import { test, expect } from "@playwright/test";
import { nav, seeded, signIn, expectAccessible, screenshot, receiver } from "./helpers.mjs";

test.describe.configure({ mode: "serial" });

const base = () => process.env.RAILHOOK_UI_BASE;

async function api(request, method, url, body) {
  const res = await request.fetch(base() + url, {
    method,
    headers: { authorization: `Bearer ${seeded().key}`, "content-type": "application/json" },
    data: body === undefined ? undefined : JSON.stringify(body),
  });
  expect(res.ok(), `${method} ${url}: ${res.status()} ${await res.text()}`).toBeTruthy();
  return res.json();
}

/** `n` Events of `type`, `parallel` requests at a time. */
async function ingest(request, type, n, parallel = 8) {
  let next = 0;
  const one = async () => {
    for (let i = next++; i < n; i = next++) await api(request, "POST", "/v1/events", { type, payload: { n: i } });
  };
  await Promise.all(Array.from({ length: parallel }, one));
}

/** A time as the form's datetime-local field takes it (UTC, to the minute, rounded down). */
const minute = (t) => new Date(t).toISOString().slice(0, 16);

/** Every Delivery of an Endpoint, through the API's cursor. */
async function deliveriesOf(request, endpoint) {
  const all = [];
  let cursor = "";
  for (;;) {
    const page = await api(request, "GET", `/v1/deliveries?endpoint_id=${endpoint}&limit=200${cursor}`);
    all.push(...page.data);
    if (!page.next_cursor) return all;
    cursor = `&cursor=${page.next_cursor}`;
  }
}

/** made / total as the Replay's page shows them. */
async function progressOf(page) {
  const made = Number(await page.locator("#replay-progress .made").textContent());
  const total = Number(await page.locator("#replay-progress .total").textContent());
  return { made, total };
}

test("estimate a Replay, start it, and watch it complete with made == total", async ({ page, request }) => {
  const { key, orders } = seeded();
  const from = minute(Date.now());
  for (let i = 1; i <= 4; i++) await api(request, "POST", "/v1/events", { type: "order.refunded", payload: { order: `ord_${i}` } });

  await signIn(page, key);
  await nav(page, "Time Machine").click();
  await expect(page.getByRole("heading", { name: "Time Machine", level: 1 })).toBeVisible();
  await expect(nav(page, "Time Machine")).toHaveAttribute("aria-current", "page");
  await page.getByLabel("From (UTC)").fill(from);
  await page.getByLabel("Event types").fill("order.refunded");
  await page.getByRole("checkbox", { name: /^Orders/ }).check();
  await page.getByRole("button", { name: "Estimate" }).click();

  // The dry run, before anything is made.
  await expect(page.getByRole("heading", { name: "Estimate" })).toBeVisible();
  await expect(page.locator("#estimate-deliveries")).toHaveText("4");
  await expect(page.locator("#estimate-events")).toHaveText("4");
  await expectAccessible(page);
  await screenshot(page, "replay-estimate");

  await page.getByRole("button", { name: "Start the Replay" }).click();
  await expect(page).toHaveURL(/\/ui\/replays\/rpl_[^/?]+\?started=1$/);
  await expect(page.getByRole("status")).toContainText("Started");
  // The page reloads itself every 3 s while the Replay runs.
  await expect(page.locator("#replay-state")).toHaveText("completed", { timeout: 30_000 });
  const { made, total } = await progressOf(page);
  expect(total).toBe(4);
  expect(made).toBe(total);
  await expect(page.getByRole("button", { name: "Cancel the Replay" })).toHaveCount(0);
  await expectAccessible(page);
  await screenshot(page, "replay");

  // The replayed Deliveries reach the receiver: 4 originals and 4 new ones, each delivered.
  await expect(async () => {
    await page.goto(`/ui/deliveries?event_type=order.refunded&endpoint_id=${orders}&status=SUCCESS`);
    await expect(page.locator("table tbody tr")).toHaveCount(8, { timeout: 1000 });
  }).toPass({ timeout: 30_000 });
  const refunded = (await deliveriesOf(request, orders)).filter((d) => d.event_type === "order.refunded");
  expect(refunded).toHaveLength(8);
  const log = await (await request.get(`${receiver()}/log`)).json();
  const ids = new Set(refunded.map((d) => d.id));
  const arrived = new Set(log.filter((entry) => ids.has(entry.webhookId)).map((entry) => entry.webhookId));
  expect(arrived.size, "each Delivery's webhook-id arrived at the receiver").toBe(8);
});

test("a long Replay is cancelled half-way: nothing is made after the cancel", async ({ page, request }) => {
  test.setTimeout(180_000);
  const from = minute(Date.now());
  // Stored while nothing subscribes to them: only the Replay makes Deliveries of these.
  await ingest(request, "audit.logged", 2000);
  const archive = await api(request, "POST", "/v1/endpoints", { url: `${receiver()}/ok/archive`, description: "Archive" });
  await api(request, "POST", "/v1/subscriptions", { endpoint_id: archive.id, event_type: "audit.*" });

  await signIn(page, seeded().key);
  await nav(page, "Time Machine").click();
  await page.getByLabel("From (UTC)").fill(from);
  await page.getByLabel("Event types").fill("audit.*");
  await page.getByRole("button", { name: "Estimate" }).click();
  await expect(page.locator("#estimate-deliveries")).toHaveText("2000");
  await page.getByRole("button", { name: "Start the Replay" }).click();
  await expect(page.locator("#replay-state")).toHaveText("running");
  // Half-way: once the first batch has made its Deliveries (about 20 batches to go).
  await expect(async () => {
    await page.reload();
    expect(Number(await page.locator("#replay-progress .made").textContent())).toBeGreaterThan(0);
  }).toPass({ intervals: [200], timeout: 30_000 });

  page.once("dialog", (d) => d.accept());
  await page.getByRole("button", { name: "Cancel the Replay" }).click();
  await expect(page.getByRole("status")).toContainText("Cancelled");
  await expect(page.locator("#replay-state")).toHaveText("cancelled");
  const { made, total } = await progressOf(page);
  expect(total).toBe(2000);
  expect(made).toBeGreaterThan(0);
  expect(made).toBeLessThan(total);
  const replayId = page.url().match(/rpl_[^/?]+/)[0];
  console.log(`replay ${replayId} cancelled at ${made} of ${total}`);

  // What was made is delivered, and nothing more appears: the count the page showed is final.
  await expect(async () => {
    const replayed = await deliveriesOf(request, archive.id);
    expect(replayed.every((d) => d.status === "SUCCESS")).toBe(true);
    expect(replayed.length).toBe(made);
  }).toPass({ timeout: 30_000 });
  const replay = await api(request, "GET", `/v1/replays/${replayId}`);
  expect(replay).toMatchObject({ state: "cancelled", made });

  // The list: both Replays with their state and progress.
  await nav(page, "Time Machine").click();
  const row = page.locator(`tr[data-replay="${replayId}"]`);
  await expect(row).toContainText("cancelled");
  await expect(row).toContainText(`${made} / 2000`);
  await expect(page.locator("tbody tr", { hasText: "completed" })).toHaveCount(1);
  await expectAccessible(page);
  await screenshot(page, "replays");
});
