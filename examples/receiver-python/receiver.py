"""A Railhook receiver in Python: verifies Standard Webhooks signatures with the
`standardwebhooks` package and dedupes on `webhook-id` with psycopg, in the same transaction
as its effect.

    WEBHOOK_SECRET=whsec_... DATABASE_URL=postgresql://... PORT=8000 python receiver.py

WEBHOOK_SECRET may hold several secrets separated by spaces (during a secret rotation, the
old and the new one): a request is accepted when it verifies with any of them.

Every POST is handled the same way (any path):
  1. verify the signature and the timestamp (5 minutes' tolerance): 401 if that fails;
  2. in ONE transaction: insert the webhook-id into processed_webhooks (ON CONFLICT DO
     NOTHING); if that inserted a row, do the effect (here: append a row to `effects`);
     commit;
  3. answer 200 {"status": "processed"} or 200 {"status": "duplicate"}.

Railhook may send the same Delivery twice (the receiver acted but its answer was lost):
the second arrival finds the id and has no effect. If the process dies before the commit,
neither the id nor the effect is kept, and Railhook's retry acts.
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

# The receiver kit's table (docs/RECEIVER.md); the same DDL as railhook_receiver::PROCESSED_WEBHOOKS_DDL.
PROCESSED_WEBHOOKS_DDL = """
CREATE TABLE IF NOT EXISTS processed_webhooks (
    webhook_id   text        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS processed_webhooks_processed_at ON processed_webhooks (processed_at);
"""

# The example's effect: a ledger with no unique key of its own, so only the dedupe above
# keeps an Event from being booked twice.
EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS effects (
    id          bigserial   PRIMARY KEY,
    webhook_id  text        NOT NULL,
    event_id    text        NOT NULL,
    event_type  text        NOT NULL,
    data        jsonb,
    receiver    text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
"""

MAX_BODY = 1 << 20

DATABASE_URL = os.environ["DATABASE_URL"]
WEBHOOKS = [Webhook(s) for s in os.environ["WEBHOOK_SECRET"].split()]


def verify(body: bytes, headers: dict) -> None:
    """Raises WebhookVerificationError unless some secret verifies the request."""
    last = WebhookVerificationError("no secret configured")
    for webhook in WEBHOOKS:
        try:
            webhook.verify(body, headers, json_parse=False)
            return
        except WebhookVerificationError as e:
            last = e
        except (ValueError, TypeError) as e:  # a malformed header the package does not wrap
            last = WebhookVerificationError(f"malformed headers: {e}")
    raise last


def process(webhook_id: str, event: dict) -> bool:
    """The dedupe and the effect in one transaction; True when this was the first time."""
    with psycopg.connect(DATABASE_URL) as conn:
        with conn.transaction():
            cur = conn.execute(
                "INSERT INTO processed_webhooks (webhook_id) VALUES (%s) ON CONFLICT (webhook_id) DO NOTHING",
                (webhook_id,),
            )
            if cur.rowcount != 1:
                return False
            conn.execute(
                "INSERT INTO effects (webhook_id, event_id, event_type, data, receiver) VALUES (%s, %s, %s, %s, 'python')",
                (webhook_id, event["id"], event["type"], json.dumps(event.get("data"))),
            )
            return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self.answer(413, {"error": {"code": "body_too_large", "message": f"at most {MAX_BODY} bytes"}})
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            verify(body, headers)
        except WebhookVerificationError as e:
            return self.answer(401, {"error": {"code": "invalid_signature", "message": str(e)}})
        try:
            event = json.loads(body)
        except ValueError as e:
            return self.answer(400, {"error": {"code": "invalid_json", "message": str(e)}})
        try:
            first = process(headers["webhook-id"], event)
        except psycopg.Error as e:
            # Nothing was committed: a 5xx makes Railhook retry.
            print(f"database error: {e}", file=sys.stderr, flush=True)
            return self.answer(503, {"error": {"code": "database", "message": "try again"}})
        self.answer(200, {"status": "processed" if first else "duplicate"})

    def answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):  # quiet: one line per request is noise here
        pass


def main() -> None:
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(PROCESSED_WEBHOOKS_DDL)
        conn.execute(EFFECTS_DDL)
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8000"))), Handler)
    # The first line on stdout says where it listens (PORT=0 picks a free port).
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
