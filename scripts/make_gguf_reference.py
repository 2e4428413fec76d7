"""Writes runtime/tests/fixtures/gguf/smollm2.json: what Python `transformers` makes of
SmolLM2-135M-Instruct.Q4_1.gguf, for the Rust GGUF loader to be checked against
(runtime/tests/it/gguf.rs).

Run with the torch venv (transformers 5.24, torch, the `gguf` package), after
`bash scripts/fetch_smollm2.sh`:

    /work/torch-venv/bin/python scripts/make_gguf_reference.py

It records, in float32 on the CPU:
- token ids and decoded text for varied strings (special tokens encode as single ids);
- for three ChatML prompts, the last position's logits (the top 50 with their ids, and a few
  fixed ids) and the greedy 24-token continuation (no stop token: exactly 24 argmax steps).

On tokenization: transformers' GGUF converter builds a plain GPT-2 pre-tokenizer for
`tokenizer.ggml.pre = smollm`, while SmolLM2's own tokenizer.json (and llama.cpp's `smollm`
pre-tokenizer) first splits digits one by one. The reference uses the model's own
pre-tokenizer, `Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)]`,
and the fixture lists the strings on which the converter's tokenizer differs from it (none of
these: SmolLM2's vocabulary has no token joining a digit to anything).
"""

import json
import os
import sys

import torch
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "target", "models")
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = os.path.join(ROOT, "runtime", "tests", "fixtures", "gguf", "smollm2.json")

STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and   runs of    spaces  ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "Numbers: 0 7 42 1234567 3.14159 -12,000",
    "déjà vu, naïve café, Ærø",
    "東京は日本の首都です。",
    "emoji 😀🚀 and symbols ∑∫√ ≠ ≤",
    "def f(x):\n    return x ** 2  # square\n",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "it's I'm we'll they've she'd CAN'T",
    "<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|><repo_name>agentry<file_sep>",
    "",
    "a",
]

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "What is 12 + 30?",
]
FIXED_IDS = [0, 1, 2, 17, 100, 1000, 10000, 49151]
TOP = 50
STEPS = 24


def chatml(question):
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )


def main():
    path = os.path.join(DIR, FILE)
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run `bash scripts/fetch_smollm2.sh` first")
    converted = AutoTokenizer.from_pretrained(DIR, gguf_file=FILE)
    tokenizer = AutoTokenizer.from_pretrained(DIR, gguf_file=FILE)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    strings, differs = [], []
    for text in STRINGS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if ids != converted.encode(text, add_special_tokens=False):
            differs.append(text)
        strings.append(
            {"text": text, "ids": ids, "decoded": tokenizer.decode(ids, skip_special_tokens=False)}
        )

    model = AutoModelForCausalLM.from_pretrained(DIR, gguf_file=FILE, dtype=torch.float32)
    model.eval()
    prompts = []
    with torch.no_grad():
        for question in QUESTIONS:
            text = chatml(question)
            ids = tokenizer.encode(text, add_special_tokens=False)
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            top = torch.topk(logits, TOP)
            seq = list(ids)
            for _ in range(STEPS):
                next_id = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                seq.append(next_id)
            continuation = seq[len(ids):]
            prompts.append(
                {
                    "question": question,
                    "text": text,
                    "ids": ids,
                    "top_ids": top.indices.tolist(),
                    "top_logits": top.values.tolist(),
                    "fixed_ids": FIXED_IDS,
                    "fixed_logits": [float(logits[i]) for i in FIXED_IDS],
                    "greedy": continuation,
                    "greedy_text": tokenizer.decode(continuation, skip_special_tokens=False),
                }
            )
            print(question, "->", repr(prompts[-1]["greedy_text"]))

    fixture = {
        "file": FILE,
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "converter_pretokenizer_differs_on": differs,
        "strings": strings,
        "prompts": prompts,
    }
    with open(OUT, "w") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", OUT, "; converter differs on", differs)


if __name__ == "__main__":
    main()
