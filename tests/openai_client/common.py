"""Shared helpers of the `openai` client suites (run by cli/tests/openai_server.rs).

Environment: DAYONE_URL (http://127.0.0.1:PORT), DAYONE_MODEL (the served name),
DAYONE_API_KEY (optional).
"""

import json
import os
import unittest
import urllib.error
import urllib.request

import openai

URL = os.environ["DAYONE_URL"]
MODEL = os.environ["DAYONE_MODEL"]
KEY = os.environ.get("DAYONE_API_KEY") or "none"


def client(**kw):
    return openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=120, **kw)


def async_client():
    return openai.AsyncOpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=120)


def extra(obj, key):
    """A field outside the openai types (vLLM extensions: token_ids, reasoning_content...)."""
    if obj is None:
        return None
    ex = getattr(obj, "model_extra", None) or {}
    if key in ex:
        return ex[key]
    return getattr(obj, key, None)


def post(path, body, headers=None):
    """POST JSON; returns (status, parsed body or raw bytes)."""
    data = json.dumps(body).encode() if not isinstance(body, bytes) else body
    req = urllib.request.Request(URL + path, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + KEY)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        status = e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def raw_sse(path, body):
    """POSTs a streaming request with plain urllib; returns (content type, [data payloads],
    raw lines), checking the SSE framing (`data: ...` lines separated by blank lines)."""
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + KEY)
    with urllib.request.urlopen(req, timeout=120) as r:
        ctype = r.headers.get("Content-Type", "")
        text = r.read().decode("utf-8")
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        for line in block.split("\n"):
            if line.startswith(":"):
                continue  # keep-alive comment
            assert line.startswith("data: "), "not an SSE data line: %r" % line
            events.append(line[len("data: "):])
    return ctype, events, text


def main():
    unittest.main(verbosity=2)
