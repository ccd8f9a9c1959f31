"""The fuzz run's check of schema-valid requests (tests/fuzz/run; docs/API.md, "Schema and fuzzing").

`schema_valid_accepted` is schemathesis' `positive_data_acceptance` (a request generated from
the schema's positive data must be accepted; 401, 404 and 409 are allowed, see
schemathesis.toml) with one addition: a 400 or 422 whose `error.code` is one of RULE_CODES is
allowed too. Those codes are the server's refusals that no schema can rule out, each
documented in docs/API.md:

- invalid_range: a rule between two fields or the clock (`to` later than `from`, `from` in
  the past, a Replay's range at most replay.max_range_days);
- url_unresolvable, url_not_allowed: the URL's host does not resolve, or resolves to an
  address network.allow_cidrs denies (a property of DNS, not of the string);
- duplicate_header: two custom header names that differ only in case;
- invalid_for_provider: a Source's `config` or `secret` its provider's verifier cannot use.

Any other 4xx for schema-valid data fails the run: the document did not state what the
server enforces.
"""

import json

import schemathesis
from schemathesis.core.failures import Failure
from schemathesis.specs.openapi.checks import positive_data_acceptance

RULE_CODES = frozenset({"invalid_range", "url_unresolvable", "url_not_allowed", "duplicate_header", "invalid_for_provider"})


def _error_code(response):
    try:
        return json.loads(response.content)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


@schemathesis.check
def schema_valid_accepted(ctx, response, case):
    try:
        return positive_data_acceptance(ctx, response, case)
    except Failure:
        if response.status_code in (400, 422) and _error_code(response) in RULE_CODES:
            return None
        raise
