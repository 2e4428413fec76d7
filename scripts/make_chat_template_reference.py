"""Renders conversations with chat templates through transformers' own Jinja setup
(`render_jinja_template`, what `apply_chat_template` calls), for the runtime's
`text_template` tests to compare minijinja's renders with.

    /work/torch-venv/bin/python scripts/make_chat_template_reference.py

Writes runtime/tests/fixtures/chat/reference.json. Needs transformers and gguf; reads
SmolLM2-135M-Instruct's GGUF at target/models/ (scripts/fetch_smollm2.sh fetches it).
"""

import json
from pathlib import Path

import gguf
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "runtime/tests/fixtures/chat/reference.json"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "count",
            "description": "Counts the entities of a variable, e.g. \"#0\" <é>.",
            "parameters": {
                "type": "object",
                "properties": {"variable": {"type": "string", "description": "A variable."}},
                "required": ["variable"],
            },
        },
    }
]

MESSAGES = [
    {"role": "system", "content": "  Solve the task.\n"},
    {"role": "user", "content": "How many neighbors does #0 have? 東京 😀"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "count", "arguments": {"variable": "#0"}}}
        ],
    },
    {"role": "tool", "content": "3 <|im_end|>"},
    {"role": "assistant", "content": "Three."},
]


def smollm2_template():
    path = ROOT / "target/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def main():
    templates = {
        "smollm2": smollm2_template(),
        "hermes_tools": (ROOT / "runtime/tests/fixtures/chat/hermes_tools.jinja").read_text(),
    }
    cases = []
    for name, template in templates.items():
        for tools in (None, TOOLS):
            for generation in (False, True):
                messages = MESSAGES[:4] if generation else MESSAGES
                if name == "smollm2":
                    # SmolLM2's plain template prints `content`, not `tool_calls`.
                    messages = [m for m in messages if "tool_calls" not in m]
                rendered = render_jinja_template(
                    conversations=[messages],
                    tools=tools,
                    chat_template=template,
                    add_generation_prompt=generation,
                    bos_token="<|im_start|>",
                    eos_token="<|im_end|>",
                )[0][0]
                cases.append(
                    {
                        "template": name,
                        "messages": messages,
                        "tools": tools,
                        "add_generation_prompt": generation,
                        "text": rendered,
                    }
                )
    reference = {
        "generated_by": "scripts/make_chat_template_reference.py",
        "transformers": transformers.__version__,
        "cases": cases,
    }
    OUT.write_text(json.dumps(reference, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
