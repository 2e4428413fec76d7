#!/usr/bin/env python3
"""Writes the tiny Hugging Face checkpoints under runtime/tests/fixtures/hf/ and the
reference outputs `runtime/tests/it/hf_checkpoint.rs` compares Agentry against.

Run once by hand (CI never runs it; it only reads the committed files):

    python3 -m venv /tmp/hf-venv
    /tmp/hf-venv/bin/pip install torch transformers safetensors tokenizers
    /tmp/hf-venv/bin/python scripts/make_hf_fixture.py

Two models, both random and tiny (about 0.4 MB on disk together):

* `qwen2/`: Qwen2 with q/k/v biases, grouped-query attention (4 query heads, 2 key/value
  heads), tied embeddings, f32 weights saved in shards with an index
  (`model.safetensors.index.json`), ChatML special tokens.
* `llama/`: Llama with one key/value head for 4 query heads, llama3 rope scaling, attention
  and MLP biases, an untied LM head, bf16 weights in one `model.safetensors`, Llama 3 header
  special tokens.

Each directory gets `reference.json`: the logits of a fixed token batch, greedy generations
of 16 tokens from two prompts, the rotary inverse frequencies, and the ids of a few texts
under its tokenizer. The reference model is the saved checkpoint reloaded in float32, so a bf16
checkpoint is compared with its exact f32 upcast.

The weights are drawn with a larger spread than transformers' default init (std 0.02 gives
nearly uniform logits, where a greedy choice could hinge on rounding); the script checks that
every greedy step wins by a clear margin and records the smallest margin.
"""

import json
import os
import shutil
import sys

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "runtime", "tests", "fixtures", "hf")

# Pre-tokenizer patterns of Qwen2 and Llama 3 (they differ in how digits group).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CORPUS = [
    "You are a helpful agent. Call one tool per turn.",
    "get_relations(variable) get_neighbors(variable, relation) count(variable)",
    'count(variable="#0")',
    "Who directed the film? The answer is #3.",
    "execute_sql(query=\"SELECT name FROM users WHERE age > 30\")",
    "commit_final_answer(answers=[\"alice\", \"bob\"])",
    "bash_action(script=\"ls -la /home/user && cat notes.txt\")",
    "take_action(action=\"go to countertop 1\")",
    "search_action(keywords=\"red running shoes size 10\")",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "Observation: Nothing happens.\n\nYou are in the middle of a room.",
    "café naïve résumé — 東京 😀",
]

# Texts whose ids the Rust tokenizer must reproduce: seen and unseen words, digits, runs of
# spaces and newlines, non-ASCII, and marker text that must stay plain text.
TOKENIZER_TEXTS = [
    "count(variable=\"#0\")",
    "Who directed the film Kavoren?  Twice:\n\n  yes",
    "SELECT 12345 FROM t WHERE x >= 3.14159;",
    "naïve café in 東京, unseen zyxwvq 😀!",
    "   leading spaces\ttab\r\nwindows line",
    "<|im_end|> and <|eot_id|> are plain text here",
]

# The chat templates of the two families (ChatML as Qwen2 renders it, Llama 3's headers), and
# one turn of a tool-calling episode in Agentry's layout: system line of tool signatures,
# instruction, a call in the compact syntax, its observation, the next assistant header.
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
CHAT = [
    {"role": "system", "content": "get_neighbors(variable, relation) count(variable)"},
    {"role": "user", "content": "How many neighbors does #0 have?"},
    {"role": "assistant", "content": 'count(variable="#0")'},
    {"role": "tool", "content": "#1, 3 entities"},
]

PROMPTS = [
    "Who directed the film?",
    "count(variable=\"#0\") then get_neighbors",
]


def train_tokenizer(pattern, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(specials) + 64,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def spread_weights(model, seed):
    """Redraws every weight with a spread that makes logits clearly distinct."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)


def greedy(model, ids, steps):
    """Greedy continuation with transformers' generate, and the smallest top-1/top-2 margin."""
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[0, len(ids):].tolist()
    margin = min(
        float(top[0] - top[1]) for top in (torch.topk(s[0], 2).values for s in out.scores)
    )
    return new, margin


def write(name, model_cls, config, pattern, specials, template, dtype, shard, seeds):
    """Saves the first seed's model whose greedy continuations are varied (a random model
    often repeats one token, which would test little) and decided by a clear margin."""
    for seed in seeds:
        if write_seed(name, model_cls, config, pattern, specials, template, dtype, shard, seed):
            return
    sys.exit(f"{name}: no seed in {list(seeds)} gives varied, clearly decided generations")


def write_seed(name, model_cls, config, pattern, specials, template, dtype, shard, seed):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(pattern, specials),
        eos_token=specials[1],
        pad_token=specials[0],
        bos_token=specials[2],
        chat_template=template,
    )
    fast.save_pretrained(path)
    config.vocab_size = len(fast)

    torch.manual_seed(seed)
    model = model_cls(config)
    spread_weights(model, seed)
    model = model.to(dtype)
    model.save_pretrained(path, max_shard_size=shard)

    # The reference is the checkpoint as saved, reloaded in f32.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(path)

    gen = torch.Generator().manual_seed(seed + 1)
    batch = torch.randint(0, config.vocab_size, (2, 10), generator=gen)
    with torch.no_grad():
        logits = model(batch).logits

    generations = []
    margins = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False)
        new, margin = greedy(model, ids, 16)
        generations.append({"prompt": ids, "tokens": new})
        margins.append(margin)
    distinct = min(len(set(g["tokens"])) for g in generations)
    if min(margins) < 1e-3 or distinct < 6:
        print(f"{name}: seed {seed} gives margin {min(margins):.4f}, {distinct} distinct tokens")
        return False

    texts = []
    for text in TOKENIZER_TEXTS:
        # Agentry never reads special tokens out of plain text (an observation could forge a
        # turn end), which is transformers' `split_special_tokens=True`.
        ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        texts.append({"text": text, "ids": ids, "decoded": tok.decode(ids)})

    chat_text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    chat = {
        "messages": CHAT,
        "text": chat_text,
        # The template's markers are meant as special tokens here.
        "ids": tok.encode(chat_text, add_special_tokens=False),
    }

    reference = {
        "generated_by": "scripts/make_hf_fixture.py",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "tokens": batch.tolist(),
        "logits": [[[float(f"{x:.7g}") for x in pos] for pos in row] for row in logits.tolist()],
        "inv_freq": model.model.rotary_emb.inv_freq.tolist(),
        "greedy": generations,
        "seed": seed,
        "min_greedy_margin": min(margins),
        "tokenizer": texts,
        "chat": chat,
        "specials": {t: tok.convert_tokens_to_ids(t) for t in specials},
    }
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(reference, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    files = sorted(os.listdir(path))
    size = sum(os.path.getsize(os.path.join(path, f)) for f in files)
    print(f"{name}: seed {seed}, {size} bytes, files {files}, min greedy margin {min(margins):.4f}")
    return True


def main():
    qwen2 = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        # Long enough for a few turns of a built-in task in an experiment test.
        max_position_embeddings=2048,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    write(
        "qwen2",
        Qwen2ForCausalLM,
        qwen2,
        QWEN2_PATTERN,
        ["<|endoftext|>", "<|im_end|>", "<|im_start|>"],
        CHATML_TEMPLATE,
        torch.float32,
        "40KB",
        seeds=range(11, 60),
    )
    llama = LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        rope_theta=500_000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        rms_norm_eps=1e-5,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
    )
    write(
        "llama",
        LlamaForCausalLM,
        llama,
        LLAMA3_PATTERN,
        [
            "<|end_of_text|>",
            "<|eot_id|>",
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
        ],
        LLAMA3_TEMPLATE,
        torch.bfloat16,
        "10MB",
        seeds=range(23, 80),
    )


if __name__ == "__main__":
    main()
