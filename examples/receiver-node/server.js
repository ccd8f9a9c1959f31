// A Railhook receiver in Node: verifies Standard Webhooks signatures with the
// `standardwebhooks` package and dedupes on `webhook-id` with pg, in the same transaction as
// its effect.
//
//     WEBHOOK_SECRET=whsec_... DATABASE_URL=postgresql://... PORT=8000 node server.js
//
// WEBHOOK_SECRET may hold several secrets separated by spaces (during a secret rotation, the
// old and the new one): a request is accepted when it verifies with any of them.
//
// Every POST is handled the same way (any path):
//   1. verify the signature and the timestamp (5 minutes' tolerance): 401 if that fails;
//   2. in ONE transaction: insert the webhook-id into processed_webhooks (ON CONFLICT DO
//      NOTHING); if that inserted a row, do the effect (here: append a row to `effects`);
//      commit;
//   3. answer 200 {"status": "processed"} or 200 {"status": "duplicate"}.
//
// Railhook may send the same Delivery twice (the receiver acted but its answer was lost):
// the second arrival finds the id and has no effect. If the process dies before the commit,
// neither the id nor the effect is kept, and Railhook's retry acts.
"use strict";

const http = require("node:http");
const { Pool } = require("pg");
const { Webhook } = require("standardwebhooks");

// The receiver kit's table (docs/RECEIVER.md); the same DDL as railhook_receiver::PROCESSED_WEBHOOKS_DDL.
const PROCESSED_WEBHOOKS_DDL = `
CREATE TABLE IF NOT EXISTS processed_webhooks (
    webhook_id   text        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS processed_webhooks_processed_at ON processed_webhooks (processed_at);
`;

// The example's effect: a ledger with no unique key of its own, so only the dedupe above
// keeps an Event from being booked twice.
const EFFECTS_DDL = `
CREATE TABLE IF NOT EXISTS effects (
    id          bigserial   PRIMARY KEY,
    webhook_id  text        NOT NULL,
    event_id    text        NOT NULL,
    event_type  text        NOT NULL,
    data        jsonb,
    receiver    text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
`;

const MAX_BODY = 1 << 20;

const pool = new Pool({ connectionString: process.env.DATABASE_URL, max: 10 });
const webhooks = (process.env.WEBHOOK_SECRET || "").split(/\s+/).filter(Boolean).map((s) => new Webhook(s));

// Throws unless some secret verifies the request. The body is passed as the exact bytes
// received: re-serialising parsed JSON would change them and break the signature.
function verify(body, headers) {
  let last = new Error("no secret configured");
  for (const webhook of webhooks) {
    try {
      webhook.verify(body, headers);
      return;
    } catch (e) {
      last = e;
    }
  }
  throw last;
}

// The dedupe and the effect in one transaction; true when this was the first time.
async function processDelivery(webhookId, event) {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const dedupe = await client.query(
      "INSERT INTO processed_webhooks (webhook_id) VALUES ($1) ON CONFLICT (webhook_id) DO NOTHING",
      [webhookId],
    );
    const first = dedupe.rowCount === 1;
    if (first) {
      await client.query(
        "INSERT INTO effects (webhook_id, event_id, event_type, data, receiver) VALUES ($1, $2, $3, $4, 'node')",
        [webhookId, event.id, event.type, JSON.stringify(event.data ?? null)],
      );
    }
    await client.query("COMMIT");
    return first;
  } catch (e) {
    await client.query("ROLLBACK").catch(() => {});
    throw e;
  } finally {
    client.release();
  }
}

function answer(res, status, payload) {
  const data = JSON.stringify(payload);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(data) });
  res.end(data);
}

async function handle(req, res) {
  if (req.method !== "POST") return answer(res, 405, { error: { code: "method_not_allowed", message: "POST only" } });
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > MAX_BODY) return answer(res, 413, { error: { code: "body_too_large", message: `at most ${MAX_BODY} bytes` } });
    chunks.push(chunk);
  }
  const body = Buffer.concat(chunks);
  try {
    verify(body, req.headers);
  } catch (e) {
    return answer(res, 401, { error: { code: "invalid_signature", message: String(e.message || e) } });
  }
  let event;
  try {
    event = JSON.parse(body.toString("utf8"));
  } catch (e) {
    return answer(res, 400, { error: { code: "invalid_json", message: String(e.message) } });
  }
  try {
    const first = await processDelivery(req.headers["webhook-id"], event);
    answer(res, 200, { status: first ? "processed" : "duplicate" });
  } catch (e) {
    // Nothing was committed: a 5xx makes Railhook retry.
    console.error(`database error: ${e.message}`);
    answer(res, 503, { error: { code: "database", message: "try again" } });
  }
}

async function main() {
  await pool.query(PROCESSED_WEBHOOKS_DDL);
  await pool.query(EFFECTS_DDL);
  const server = http.createServer((req, res) => {
    handle(req, res).catch((e) => {
      console.error(e);
      if (!res.headersSent) answer(res, 500, { error: { code: "internal", message: "internal error" } });
    });
  });
  server.listen(Number(process.env.PORT ?? 8000), "127.0.0.1", () => {
    // The first line on stdout says where it listens (PORT=0 picks a free port).
    console.log(`listening on http://127.0.0.1:${server.address().port}`);
  });
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
