"""Seeds the fuzz run's project with one resource of each kind and prints, as TOML, the
schemathesis dictionaries that hold their ids (tests/fuzz/run appends them to the config).

With them, an operation on `/v1/endpoints/{id}` is sent the real Endpoint's id for some of
its cases (see the `[[operations]]` bindings in schemathesis.toml) and so reaches past the
404 into the handler's own checks. Usage: seed.py BASE_URL API_KEY ORG_ID
"""

import hashlib
import hmac
import json
import sys
import urllib.request

BASE, KEY, ORG = sys.argv[1:4]


def call(method, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(BASE + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {KEY}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    with urllib.request.urlopen(request) as response:
        return json.load(response)


endpoint = call("POST", "/v1/endpoints", {"url": "http://127.0.0.1:9/fuzz"})["id"]
subscription = call("POST", "/v1/subscriptions", {"endpoint_id": endpoint, "event_type": "**"})["id"]
event = call("POST", "/v1/events", {"type": "order.paid", "payload": {"n": 1}})
delivery = event["deliveries"][0]["id"]
api_key = call("POST", "/v1/api-keys", {"name": "spare"})["id"]
secret = "fuzz-source-secret"
config = {"header": "X-Sig", "algorithm": "sha256", "encoding": "hex"}
source = call("POST", "/v1/sources", {"provider": "generic_hmac", "config": config, "secret": secret})
body = b'{"fuzz": true}'
signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
incoming = call("POST", source["ingress_path"], headers={"X-Sig": signature, "Content-Type": "application/json"}, raw=body)["id"]
destination = call("POST", f"/v1/sources/{source['id']}/destinations", {"url": "http://127.0.0.1:9/fuzz"})["id"]
forward = call("POST", f"/v1/incoming-events/{incoming}/replay", {})["forwards"][0]["id"]

for name, value in [
    ("organization", ORG),
    ("endpoint", endpoint),
    ("subscription", subscription),
    ("event", event["id"]),
    ("delivery", delivery),
    ("api_key", api_key),
    ("source", source["id"]),
    ("incoming_event", incoming),
    ("destination", destination),
    ("forward", forward),
]:
    print(f"[dictionaries.{name}]\nvalues = [{json.dumps(value)}]\n")
