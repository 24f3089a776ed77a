"""Server-sent events from an OpenAI-compatible server: the one reader of the LLM load
generators (bench/llm_load.py, bench/llm_json_load.py). Only the standard library."""
import http.client
import json
from urllib.parse import urlparse


class HttpError(Exception):
    def __init__(self, status, body):
        super().__init__("HTTP %d: %r" % (status, body[:300]))
        self.status, self.body = status, body


def post_events(url, path, body, timeout=600):
    """POSTs `body` (a dict) to URL + path and yields each `data:` event, parsed, until
    `data: [DONE]` or the end of the stream. HttpError for an answer other than 200."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise HttpError(resp.status, resp.read())
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            yield json.loads(data)
    finally:
        conn.close()
