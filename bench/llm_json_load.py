"""One greedy chat stream per mode against an OpenAI-compatible server (bench/llm_json_compare.sh):
no constraint (128 tokens, ignore_eos), response_format json_object, and a json_schema (up to
400 tokens); then one tool-calling request (tool_choice required, one call; not streamed: kiln
sends a tool call whole). Prints one JSON line per mode: the mean inter-token latency over the
streamed tokens (tools: the request's time over its completion tokens), and whether the answer
parses and follows the schema (tools: one call of a tool, with that tool's arguments). Only the
standard library.

  llm_json_load.py URL SERVER_LABEL
"""
import http.client
import json
import sys
import time
from urllib.parse import urlparse

from sse import HttpError, post_events

SCHEMA = {
    "$defs": {"friend": {"type": "object", "properties": {"name": {"type": "string"},
                                                          "species": {"enum": ["cat", "dog", "bird"]}},
                         "required": ["name", "species"], "additionalProperties": False}},
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "colour": {"enum": ["black", "white", "ginger", "grey"]},
                   "friends": {"type": "array", "items": {"$ref": "#/$defs/friend"}, "maxItems": 3}},
    "required": ["name", "age", "colour", "friends"], "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a cat and its friends as JSON."}]


def follows(obj):
    if not isinstance(obj, dict) or list(obj) != ["name", "age", "colour", "friends"]:
        return False
    if not isinstance(obj["name"], str) or not isinstance(obj["age"], int) or obj["colour"] not in SCHEMA["properties"]["colour"]["enum"]:
        return False
    return all(isinstance(f, dict) and list(f) == ["name", "species"] and f["species"] in ("cat", "dog", "bird")
               for f in obj["friends"])


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": {"type": "object", "additionalProperties": False,
                                                          "required": ["city", "unit"],
                                                          "properties": {"city": {"type": "string"},
                                                                         "unit": {"enum": ["celsius", "fahrenheit"]}}}}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
                                           "parameters": {"type": "object", "additionalProperties": False, "required": ["tz"],
                                                          "properties": {"tz": {"type": "string"}}}}}]


def good_call(message):
    calls = message.get("tool_calls") or []
    if len(calls) != 1 or calls[0].get("type") != "function":
        return False
    f = calls[0]["function"]
    try:
        args = json.loads(f["arguments"])
    except (ValueError, KeyError, TypeError):
        return False
    if f.get("name") == "get_weather":
        return isinstance(args, dict) and list(args) == ["city", "unit"] and isinstance(args["city"], str) and \
            args["unit"] in ("celsius", "fahrenheit")
    return f.get("name") == "get_time" and isinstance(args, dict) and list(args) == ["tz"] and isinstance(args["tz"], str)


def call_tools(url, body):
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        elapsed = time.perf_counter() - t0
    finally:
        conn.close()
    if resp.status != 200:
        return {"itl_ms": 0, "pieces": 0, "finish": "HTTP %d" % resp.status, "valid": False, "text": json.dumps(answer)[:300]}
    choice = answer["choices"][0]
    tokens = answer.get("usage", {}).get("completion_tokens", 0)
    return {"itl_ms": elapsed * 1e3 / max(tokens, 1), "pieces": tokens, "finish": choice.get("finish_reason"),
            "valid": good_call(choice["message"]), "text": json.dumps(choice["message"])[:300]}


def stream(url, body):
    times, text, finish = [], "", None
    try:
        for ev in post_events(url, "/v1/chat/completions", body):
            ch = ev.get("choices") or []
            if ch and ch[0].get("finish_reason"):
                finish = ch[0]["finish_reason"]
            if ch and ch[0].get("delta", {}).get("content"):
                times.append(time.perf_counter())
                text += ch[0]["delta"]["content"]
    except HttpError as e:
        raise SystemExit(str(e))
    return times, text, finish


def main():
    url, label = sys.argv[1], sys.argv[2]
    base = {"model": "m", "messages": ASK, "temperature": 0, "max_tokens": 400, "stream": True}
    modes = {"text": dict(base, max_tokens=128, ignore_eos=True),
             "json_object": dict(base, response_format={"type": "json_object"}),
             "json_schema": dict(base, response_format={"type": "json_schema",
                                                        "json_schema": {"name": "cat", "schema": SCHEMA}})}
    stream(url, dict(base, max_tokens=16))  # warm-up
    for mode, body in modes.items():
        times, text, finish = stream(url, body)
        itl = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
        valid = True
        if mode != "text":
            try:
                obj = json.loads(text)
                valid = isinstance(obj, dict) and (mode == "json_object" or follows(obj))
            except ValueError:
                valid = False
        print(json.dumps({"server": label, "mode": mode, "itl_ms": sum(itl) / max(len(itl), 1), "pieces": len(times),
                          "finish": finish, "valid": valid, "text": text[:300]}))
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    r = call_tools(url, {"model": "m", "messages": ask, "temperature": 0, "max_tokens": 100, "tools": TOOLS,
                         "tool_choice": "required", "parallel_tool_calls": False})
    print(json.dumps(dict(r, server=label, mode="tools")))


if __name__ == "__main__":
    main()
