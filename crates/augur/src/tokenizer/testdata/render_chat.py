"""Writes chat_expected.jsonl: the templates here rendered by Jinja2 the way Transformers'
apply_chat_template renders them (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, json.dumps-based tojson, raise_exception). Run: python3 render_chat.py"""
import json
import os

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise Exception(message)


here = os.path.dirname(os.path.abspath(__file__))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
convs = [
    [
        {"role": "system", "content": "  Be terse.\n"},
        {"role": "user", "content": "Hi a b!"},
        {"role": "assistant", "content": "Hello.\n\n"},
        {"role": "user", "content": "  日本語? 😀\n"},
    ],
    [{"role": "user", "content": "only user"}],
]
with open(os.path.join(here, "chat_expected.jsonl"), "w", encoding="utf-8") as out:
    for name in ["gemma", "llama", "misc"]:
        with open(os.path.join(here, name + ".jinja"), encoding="utf-8") as f:
            template = env.from_string(f.read())
        for i, conv in enumerate(convs):
            for agp in [True, False]:
                text = template.render(messages=conv, tools=None, documents=None, add_generation_prompt=agp,
                                       bos_token="<bos>", eos_token="<eos>")
                out.write(json.dumps([name, i, agp, text], ensure_ascii=False) + "\n")
