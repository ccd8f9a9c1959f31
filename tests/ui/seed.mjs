// Global setup: creates the data the flows look at, through the public API of the stack
// ./run started, and waits until the worker has delivered (or failed) every Delivery.
//   - organization "Acme", project "Shop" (its first API key is the test's sign-in key)
//   - Endpoint "Orders" -> receiver /ok (always 200), Subscription order.*
//   - Endpoint "Billing" -> receiver /flaky (400 until healed: Failed Messages at once),
//     Subscription invoice.*
//   - 3 order.paid and 2 invoice.created Events
// Writes what the specs need to .stack/seed.json.
import fs from "node:fs";
import path from "node:path";

const base = process.env.RAILHOOK_UI_BASE;
const receiver = process.env.RAILHOOK_UI_RECEIVER;
const operator = process.env.RAILHOOK_UI_OPERATOR_TOKEN;

async function call(method, url, token, body) {
  const res = await fetch(base + url, {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${url}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function until(what, check, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

export default async function seed() {
  if (!base || !receiver || !operator) throw new Error("run the browser tests with tests/ui/run");
  const org = await call("POST", "/v1/admin/organizations", operator, { name: "Acme" });
  const project = await call("POST", `/v1/admin/organizations/${org.id}/projects`, operator, { name: "Shop" });
  const key = project.api_key.secret;
  const orders = await call("POST", "/v1/endpoints", key, { url: `${receiver}/ok/orders`, description: "Orders" });
  const billing = await call("POST", "/v1/endpoints", key, { url: `${receiver}/flaky/billing`, description: "Billing" });
  await call("POST", "/v1/subscriptions", key, { endpoint_id: orders.id, event_type: "order.*" });
  await call("POST", "/v1/subscriptions", key, { endpoint_id: billing.id, event_type: "invoice.*", max_attempts: 1 });
  for (let i = 1; i <= 3; i++) {
    await call("POST", "/v1/events", key, { type: "order.paid", payload: { order: `ord_${i}`, amount_cents: 1250 * i } });
  }
  for (let i = 1; i <= 2; i++) {
    await call("POST", "/v1/events", key, { type: "invoice.created", payload: { invoice: `inv_${i}` } });
  }
  await until("3 Deliveries delivered and 2 in Failed Messages", async () => {
    const ok = await call("GET", `/v1/deliveries?status=SUCCESS&endpoint_id=${orders.id}`, key);
    const failed = await call("GET", "/v1/failed-messages", key);
    return ok.data.length === 3 && failed.data.length === 2;
  });
  const dir = path.join(path.dirname(new URL(import.meta.url).pathname), ".stack");
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(
    path.join(dir, "seed.json"),
    JSON.stringify({ key, projectId: project.id, projectName: project.name, orders: orders.id, billing: billing.id }, null, 2),
  );
}
