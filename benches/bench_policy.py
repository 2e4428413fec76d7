#!/usr/bin/env python3
"""PyTorch twin of `examples/bench_policy.rs`: the training step, and (`--generate`) KV-cache
generation with transformers' `generate`.

The same policy transformer as Agentry's (pre-norm blocks: RMSNorm, causal multi-head attention
with rotate-half rotary embeddings, SwiGLU; final RMSNorm; LM head tied to the embedding; no
biases), the same batch of random tokens, and the same step: next-token cross-entropy, backward,
global gradient-norm clipping at 1, AdamW (lr 1e-3, weight decay 0.01, betas 0.9/0.999). It
prints `tokens_per_second=N` for `bench_policy --torch` to compare against.

With `--lora RANK` it trains PEFT LoRA adapters on transformers' `LlamaForCausalLM` of the same
shape instead (and prints its peak resident memory).

With `--generate` it builds the same shapes as a transformers `LlamaForCausalLM` (random weights,
grouped-query heads, tied or untied head), samples `--new-tokens` tokens (temperature 1, no top-k,
no early stop) for `--batch` random prompts of `--prompt` tokens, and prints
`new_tokens_per_second=N` (prefill included, after one untimed short run).

    python3 benches/bench_policy.py [--quick] [--batch 16 --seq 256 ...] [--generate]

Without PyTorch it prints a skip message and exits 0: nothing in CI needs it.
"""

import argparse
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    print("skip: PyTorch is not installed (pip install torch); nothing measured")
    sys.exit(0)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads  # the training twin uses kv_heads == heads
        self.attn_norm = nn.RMSNorm(d_model, eps=1e-5)
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.ffn_norm = nn.RMSNorm(d_model, eps=1e-5)
        self.gate = nn.Linear(d_model, ffn, bias=False)
        self.up = nn.Linear(d_model, ffn, bias=False)
        self.down = nn.Linear(ffn, d_model, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        hd = d // self.heads
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.heads, hd)
        k = self.k(h).view(b, t, self.heads, hd)
        v = self.v(h).view(b, t, self.heads, hd)
        q = rotate(q, cos, sin).transpose(1, 2)
        k = rotate(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Policy(nn.Module):
    def __init__(self, vocab: int, layers: int, d_model: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, 4 * d_model) for _ in range(layers))
        self.norm = nn.RMSNorm(d_model, eps=1e-5)
        self.heads = heads
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        b, t = tokens.shape
        d = self.embed.embedding_dim
        hd = d // self.heads
        inv = 10_000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        angles = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
        angles = torch.cat([angles, angles], dim=-1).float()[None, :, None, :]
        cos, sin = angles.cos(), angles.sin()
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x) @ self.embed.weight.T


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's own)")
    parser.add_argument("--kv-heads", type=int, default=0, help="key/value heads (0: --heads)")
    parser.add_argument("--ffn", type=int, default=0, help="SwiGLU width (0: 4 x d_model)")
    parser.add_argument("--untied", action="store_true", help="an LM head of its own")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens (--generate)")
    parser.add_argument("--new-tokens", type=int, default=256, help="new tokens (--generate)")
    parser.add_argument("--generate", action="store_true", help="time generation instead")
    parser.add_argument(
        "--recompute", action="store_true", help="with --lora: gradient checkpointing per layer"
    )
    parser.add_argument(
        "--lora", type=int, default=0, help="train PEFT LoRA adapters of this rank (transformers' Llama)"
    )
    parser.add_argument(
        "--matmul-precision",
        choices=["highest", "high", "medium"],
        default="highest",
        help="torch.set_float32_matmul_precision (bf16 on CPUs with AMX: oneDNN)",
    )
    args = parser.parse_args()
    if args.quick:
        args.batch, args.seq, args.vocab, args.layers = 2, 32, 256, 2
        args.d_model, args.heads, args.steps = 32, 2, 1

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision(args.matmul_precision)
    torch.manual_seed(0)
    if args.generate:
        generate(args)
        return
    if args.lora:
        lora_training(args)
        return
    if (args.kv_heads or args.heads) != args.heads or args.untied:
        sys.exit("the training twin has kv_heads == heads and a tied head")
    if (args.ffn or 4 * args.d_model) != 4 * args.d_model:
        sys.exit("the training twin has ffn == 4 x d_model")
    model = Policy(args.vocab, args.layers, args.d_model, args.heads)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-5, weight_decay=0.01
    )
    tokens = torch.randint(8, args.vocab, (args.batch, args.seq + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    time_training(args, lambda: model(inputs), targets, list(model.parameters()), optimizer, "")


def time_training(args, forward, targets, parameters, optimizer, label):
    """Times `args.steps` training steps (after one untimed): next-token cross-entropy of
    `forward()`'s logits, backward, clipping at 1, `optimizer`; prints the rate and
    `tokens_per_second=N`."""

    def step():
        logits = forward()
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        return loss.item()

    step()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = (time.perf_counter() - started) / args.steps
    tokens_per_second = args.batch * args.seq / seconds
    print(
        f"torch {torch.__version__}{label}, {torch.get_num_threads()} threads: "
        f"{seconds * 1e3:.1f} ms/step, {tokens_per_second:.0f} tokens/s, "
        f"peak resident memory {peak_memory()}"
    )
    print(f"tokens_per_second={tokens_per_second:.1f}")


def peak_memory():
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB)."""
    import resource

    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"


def lora_training(args):
    """LoRA training on transformers' Llama of the same shape, adapters from PEFT (rank
    `--lora`, alpha 2 x rank, the seven projections), loss on every position."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        print("skip: peft is not installed (pip install peft); nothing measured")
        return
    model = llama(args, args.seq + 8)
    if model is None:
        return
    model = get_peft_model(
        model,
        LoraConfig(
            r=args.lora,
            lora_alpha=2 * args.lora,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
    )
    if args.recompute:
        # transformers' activation checkpointing per decoder layer; PEFT needs the inputs to
        # take a gradient for the frozen embedding's output to reach the checkpointed layers.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3, betas=(0.9, 0.999), eps=1e-5, weight_decay=0.01)
    tokens = torch.randint(8, args.vocab, (args.batch, args.seq + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    time_training(
        args,
        lambda: model(input_ids=inputs).logits,
        targets,
        trainable,
        optimizer,
        f" + PEFT LoRA rank {args.lora}" + (", gradient checkpointing" if args.recompute else ""),
    )


def llama(args, positions):
    """transformers' `LlamaForCausalLM` of the benchmark's shape (random weights), or `None`
    without transformers (it says so)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        print("skip: transformers is not installed (pip install transformers); nothing measured")
        return None
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=args.ffn or 4 * args.d_model,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads or args.heads,
        max_position_embeddings=positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=not args.untied,
    )
    return LlamaForCausalLM(config)


def generate(args):
    model = llama(args, args.prompt + args.new_tokens + 8)
    if model is None:
        return
    model = model.eval()
    prompts = torch.randint(8, args.vocab, (args.batch, args.prompt))
    mask = torch.ones_like(prompts)

    def run(new_tokens):
        with torch.inference_mode():
            out = model.generate(
                prompts,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )
        return out.shape[1] - args.prompt

    run(4)
    started = time.perf_counter()
    run(1)
    prefill = time.perf_counter() - started
    started = time.perf_counter()
    new = run(args.new_tokens)
    seconds = time.perf_counter() - started
    rate = args.batch * new / seconds
    # The prefill (with its first token) timed alone; the decode steps are the rest.
    step = (seconds - prefill) / max(new - 1, 1)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads: "
        f"{seconds * 1e3:.0f} ms, {rate:.0f} new tokens/s; "
        f"prefill {prefill * 1e3:.0f} ms, then {step * 1e3:.1f} ms per decode step"
    )
    print(f"new_tokens_per_second={rate:.1f}")


if __name__ == "__main__":
    main()
