"""The official `openai` client against `augur serve` (run by tests/serve.rs::openai_python_client).

argv: TINY_ADDR SMOL_ADDR EXPECTED_JSON (a file: {"prompt", "text": greedy text, "chat": greedy chat reply})
TINY_ADDR serves the tiny-llama fixture behind the API key `test-key`, SMOL_ADDR SmolLM2-135M (slow enough to
cancel mid-stream) without a key.
"""

import json
import sys
import time
import urllib.error
import urllib.request

import openai

tiny_addr, smol_addr, expected_file = sys.argv[1:4]
with open(expected_file) as f:
    expected_texts = json.load(f)
prompt, expected, expected_chat = expected_texts["prompt"], expected_texts["text"], expected_texts["chat"]
client = openai.OpenAI(base_url=f"http://{tiny_addr}/v1", api_key="test-key", max_retries=0)
models = client.models.list()
model = models.data[0].id
assert model == "tiny-llama", model

# Non-streamed completion, greedy: the same text as `augur generate`.
c = client.completions.create(model=model, prompt=prompt, max_tokens=20, temperature=0)
assert c.choices[0].text == expected, (c.choices[0].text, expected)
assert c.usage.completion_tokens > 0
assert c.usage.prompt_tokens > 0

# Streamed completion: the chunks add up to the same text; usage arrives in the last chunk.
pieces, usage = [], None
for chunk in client.completions.create(
    model=model, prompt=prompt, max_tokens=20, temperature=0, stream=True, stream_options={"include_usage": True}
):
    if chunk.choices:
        pieces.append(chunk.choices[0].text)
    if chunk.usage:
        usage = chunk.usage
assert "".join(pieces) == expected, ("".join(pieces), expected)
assert len(pieces) > 2
assert usage is not None and usage.completion_tokens == c.usage.completion_tokens

# Chat with the model's template, whole and streamed.
messages = [{"role": "user", "content": "Name three colors."}]
r = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
assert r.choices[0].message.role == "assistant"
assert r.choices[0].message.content == expected_chat, (r.choices[0].message.content, expected_chat)
streamed = "".join(
    ch.choices[0].delta.content or ""
    for ch in client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0, stream=True
    )
    if ch.choices
)
assert streamed == expected_chat, (streamed, expected_chat)

# Per-request speculation through an extra body field; the speculative statistics come back in `usage`.
s = client.completions.create(
    model=model,
    prompt=prompt,
    max_tokens=20,
    temperature=0,
    extra_body={"speculation": {"method": "prompt_lookup", "prompt_lookup_num_tokens": 4}},
)
assert s.choices[0].text == expected
spec = s.usage.model_extra["speculation"]
assert spec["method"] == "prompt_lookup", spec
assert spec["drafted_tokens"] > 0, spec
off = client.completions.create(
    model=model, prompt=prompt, max_tokens=5, temperature=0, extra_body={"speculation": "off"}
)
assert off.usage.model_extra["speculation"]["method"] == "plain"

# Sampling with a seed is reproducible.
a = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0.8, seed=7)
b = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0.8, seed=7)
assert a.choices[0].text == b.choices[0].text

# Log-probabilities: chats' `logprobs.content` with `top_logprobs`, completions' legacy columns; greedy picks the
# most likely token.
r = client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
)
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
for t in content:
    assert len(t.top_logprobs) == 2 and t.logprob <= 0
    assert abs(t.logprob - max(x.logprob for x in t.top_logprobs)) < 1e-6, t
c = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0, logprobs=1)
assert len(c.choices[0].logprobs.token_logprobs) == 5, c.choices[0].logprobs
# Streamed, each chunk carries its tokens' entries; together they are the whole answer's.
streamed = []
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2, stream=True
):
    if chunk.choices and chunk.choices[0].logprobs is not None:
        streamed.extend(chunk.choices[0].logprobs.content)
assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in content]

# n = 2: two choices, indexed; greedy choices are equal.
two = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, n=2)
assert [ch.index for ch in two.choices] == [0, 1]
assert two.choices[0].text == two.choices[1].text == expected[: len(two.choices[0].text)]

# The API key: a wrong one is the client's AuthenticationError.
wrong = openai.OpenAI(base_url=f"http://{tiny_addr}/v1", api_key="not-the-key", max_retries=0)
try:
    wrong.models.list()
    raise AssertionError("a wrong API key must fail")
except openai.AuthenticationError as e:
    assert e.status_code == 401

# Fields augur cannot honour are refused, naming the field.
for kwargs, param in [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
]:
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=3, **kwargs)
        raise AssertionError(f"{param} must be refused")
    except openai.BadRequestError as e:
        assert e.body["param"] == param, e.body

# Errors surface as the client's exception types, with OpenAI-style bodies.
try:
    client.completions.create(model="no-such-model", prompt="hi", max_tokens=3)
    raise AssertionError("an unknown model must fail")
except openai.NotFoundError as e:
    assert e.body["code"] == "model_not_found", e.body
try:
    client.completions.create(model=model, prompt="hi", max_tokens=100000)
    raise AssertionError("too many tokens must fail")
except openai.BadRequestError as e:
    assert e.body["code"] == "context_length_exceeded", e.body
# Malformed JSON (the client cannot send it, so a raw request): 400 with an OpenAI error body.
bad = urllib.request.Request(
    f"http://{tiny_addr}/v1/completions",
    data=b"{not json",
    headers={"Content-Type": "application/json", "Authorization": "Bearer test-key"},
)
try:
    urllib.request.urlopen(bad)
    raise AssertionError("malformed JSON must fail")
except urllib.error.HTTPError as e:
    assert e.code == 400
    assert "JSON" in json.loads(e.read())["error"]["message"]

# Cancellation: close the stream after a few chunks; the server stops that generation.
def metric(addr, name):
    text = urllib.request.urlopen(f"http://{addr}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(f"augur_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no augur_{name}")

smol = openai.OpenAI(base_url=f"http://{smol_addr}/v1", api_key="unused", max_retries=0)
stream = smol.completions.create(
    model=smol.models.list().data[0].id,
    prompt="Write a long story about a dragon.",
    max_tokens=4000,
    temperature=0,
    stream=True,
    extra_body={"ignore_eos": True},
)
for i, _ in enumerate(stream):
    if i == 3:
        break
stream.close()
deadline = time.time() + 60
while metric(smol_addr, "cancelled_total") < 1:
    assert time.time() < deadline, "the generation was not cancelled"
    time.sleep(0.1)
assert metric(smol_addr, "generation_tokens_total") < 4000

print("all openai client checks passed")
