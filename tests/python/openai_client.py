"""The official `openai` client against `agentry serve`: plain, streaming, tools, logprobs,
errors, and 64 concurrent requests equal to the same requests one at a time.

Usage: python openai_client.py BASE_URL MODEL TOKEN. Prints one line per check; any failure
raises (non-zero exit).
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

base_url, model, token = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=120)

QUESTION = "Which relations does #0 have?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_relations",
            "description": "The relations of a variable.",
            "parameters": {
                "type": "object",
                "properties": {"variable": {"type": "string", "description": "A variable."}},
                "required": ["variable"],
            },
        },
    }
]


def ask(question, **extra):
    """Greedy, 8 tokens, unless `extra` says otherwise."""
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        **{"temperature": 0, "max_tokens": 8, **extra},
    )


# Plain: the shape the client parses, usage adding up.
plain = ask(QUESTION)
choice = plain.choices[0]
assert plain.object == "chat.completion" and plain.model == model, plain
assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length"), choice
assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
assert 1 <= plain.usage.completion_tokens <= 8, plain.usage
print("plain:", json.dumps(choice.message.content))

# Streaming: the chunks reassemble to the same greedy reply; usage comes last when asked.
text, finish, usage = "", None, None
for chunk in client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": QUESTION}],
    temperature=0,
    max_tokens=8,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        text += c.delta.content or ""
        finish = c.finish_reason or finish
assert text == (choice.message.content or ""), (text, choice.message.content)
assert finish == choice.finish_reason and usage == plain.usage, (finish, usage)
print("stream: equal to plain")

# Tools: a call comes back parsed (arguments a JSON object), or text with finish `stop`/`length`;
# a conversation continued with the call and its answer is accepted.
tooled = ask(QUESTION, tools=TOOLS)
c = tooled.choices[0]
if c.finish_reason == "tool_calls":
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_relations", call
    assert isinstance(json.loads(call.function.arguments), dict), call
    calls = [call.model_dump()]
else:
    assert c.message.tool_calls is None and c.finish_reason in ("stop", "length"), c
    calls = [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "get_relations", "arguments": '{"variable": "#0"}'},
        }
    ]
follow = client.chat.completions.create(
    model=model,
    messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "capital_of, borders"},
    ],
    tools=TOOLS,
    temperature=0,
    max_tokens=8,
)
assert follow.usage.prompt_tokens > tooled.usage.prompt_tokens, (follow.usage, tooled.usage)
print("tools:", c.finish_reason)

# A named tool_choice forces the call: the reply is that call, or text that begins it.
forced = ask(QUESTION, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_relations"}})
f = forced.choices[0]
if f.finish_reason == "tool_calls":
    assert f.message.tool_calls[0].function.name == "get_relations", f
else:
    assert f.message.content.startswith("get_relations("), f
try:
    ask(QUESTION, tools=TOOLS + [dict(TOOLS[0], function=dict(TOOLS[0]["function"], name="other"))],
        tool_choice="required")
    raise AssertionError("`required` with two tools was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "tool_choice", e.body
print("forced call:", f.finish_reason)

# Log-probabilities: one entry per token, alternatives most likely first, the greedy token first.
lp = ask(QUESTION, logprobs=True, top_logprobs=3).choices[0].logprobs.content
assert len(lp) == plain.usage.completion_tokens, lp
for entry in lp:
    tops = [t.logprob for t in entry.top_logprobs]
    assert len(tops) == 3 and tops == sorted(tops, reverse=True), entry
    assert abs(entry.logprob - tops[0]) < 1e-5, entry
print("logprobs:", len(lp), "tokens")

# n and seed: a seeded request repeats.
seeded = dict(temperature=1.0, seed=11, n=3, max_tokens=12)
first = [c.message.content for c in ask(QUESTION, **seeded).choices]
again = [c.message.content for c in ask(QUESTION, **seeded).choices]
assert first == again and len(first) == 3, (first, again)
print("seeded n=3: repeats")

# Errors: the client raises its typed errors with the server's message.
try:
    ask(QUESTION, temperature=5)
    raise AssertionError("temperature 5 was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "temperature", e.body
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError as e:
    assert e.body["code"] == "model_not_found", e.body
try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError:
    pass
assert [m.id for m in client.models.list().data] == [model]
print("errors: typed")

# 64 concurrent requests (64 different conversations, each sampled with its own seed) equal
# the same requests one at a time.
questions = [f"Which relations does #{i} have? {'count ' * (i % 5)}" for i in range(64)]


def reply(i):
    return ask(questions[i], temperature=1.0, seed=i, max_tokens=6).choices[0].message.content


def greedy(i):
    return ask(questions[i], max_tokens=6).choices[0].message.content


for one in (greedy, reply):
    sequential = [one(i) for i in range(64)]
    with ThreadPoolExecutor(max_workers=64) as pool:
        concurrent = list(pool.map(one, range(64)))
    differ = [i for i, (a, b) in enumerate(zip(concurrent, sequential)) if a != b]
    assert not differ, (one.__name__, differ)
    assert len(set(sequential)) > 4, sequential
print("concurrency: 64 parallel requests equal to sequential, greedy and seeded")
print("ok")
