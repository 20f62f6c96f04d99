"""Schemathesis hooks for Sluice's ingest API (loaded by tests/openapi/schemathesis.toml).

The OpenAPI document describes an NDJSON or JSON-text-sequence body as its row or the
array of its rows; these serializers write it as it goes on the wire: one JSON text per
line, or one RFC 7464 record (RS, the JSON text, LF) per text. Anything else
schemathesis makes up (a number, a string: not rows) goes as one such text.
"""

import json

import schemathesis


def _rows(value):
    return value if isinstance(value, list) else [value]


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    return "".join(json.dumps(row) + "\n" for row in _rows(value)).encode()


@schemathesis.serializer("application/json-seq")
def json_seq(ctx, value):
    return "".join("\x1e" + json.dumps(row) + "\n" for row in _rows(value)).encode()
