#!/usr/bin/env python3
"""Makes the LoRA reference: a PEFT adapter on the tiny Qwen2 fixture, saved by PEFT itself,
and the logits PEFT's model computes with it (and after `merge_and_unload`).

The adapter's values follow a formula (`value` below) that the Rust test
(`runtime/tests/it/lora.rs`) computes too: it builds the same adapters on the same base with
`finetune = lora`, exports them with `save_peft` and checks that (1) its file holds exactly
PEFT's tensors (names, shapes, values) and its config PEFT's settings, and (2) its logits
equal PEFT's. Run once from the repository root, with torch, transformers and peft installed
(never in CI); commit the outputs under runtime/tests/fixtures/lora/.

    python scripts/make_lora_reference.py
"""

import json
import math
import os

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

BASE = "runtime/tests/fixtures/hf/qwen2"
OUT = "runtime/tests/fixtures/lora"
RANK, ALPHA = 2, 3.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOKENS = [[1, 5, 9, 14, 3, 27, 8, 2], [4, 4, 19, 30, 11, 6, 0, 12]]


def value(layer, target, matrix, row, col):
    """Entry (row, col) of `lora_A` (matrix 0, `[rank, in]`) or `lora_B` (matrix 1,
    `[out, rank]`) of `target` (index in TARGETS) in block `layer`."""
    phase = 1.0 + 7 * layer + 13 * target + 29 * matrix + 0.37 * row + 0.11 * col
    return 0.05 * math.sin(phase)


def main():
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.float32)
    config = LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        lora_dropout=0.0,
        target_modules=TARGETS,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, module in model.named_modules():
            if not hasattr(module, "lora_A") or "default" not in module.lora_A:
                continue
            layer = int(name.split(".layers.")[1].split(".")[0])
            target = TARGETS.index(name.rsplit(".", 1)[1])
            for matrix, weight in enumerate(
                [module.lora_A["default"].weight, module.lora_B["default"].weight]
            ):
                rows, cols = weight.shape
                weight.copy_(
                    torch.tensor(
                        [[value(layer, target, matrix, r, c) for c in range(cols)] for r in range(rows)]
                    )
                )
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT)
    os.remove(os.path.join(OUT, "README.md"))  # PEFT's model card template
    model.eval()
    tokens = torch.tensor(TOKENS)
    with torch.no_grad():
        adapted = model(tokens).logits
        reloaded = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.float32), OUT
        )
        again = reloaded(tokens).logits
        merged = reloaded.merge_and_unload()(tokens).logits
    assert torch.allclose(adapted, again), "the saved adapter reloads to the same model"
    assert (adapted - merged).abs().max() < 1e-5, "merging changes nothing"
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(
            {
                "rank": RANK,
                "alpha": ALPHA,
                "tokens": TOKENS,
                "logits": adapted.flatten().tolist(),
                "shape": list(adapted.shape),
                "peft": __import__("peft").__version__,
            },
            f,
        )
        f.write("\n")
    print(f"wrote {OUT}: adapter and logits {list(adapted.shape)}")


if __name__ == "__main__":
    main()
