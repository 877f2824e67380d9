#!/usr/bin/env python3
"""Compares hablar's CPU and GPU backends with a float32 reference implementation of the same
model (Hugging Face transformers loading the GGUF file, dequantized to float32), on the dump
that gpu_parity_tests writes with HABLAR_PARITY_DUMP=FILE:

  - teacher-forced: per position, |log-softmax - reference| over the CPU's 16 likeliest
    tokens (max and mean) and top-1 agreement with the reference, for each backend;
  - greedy 64 tokens: how many prompts each backend continues exactly as the reference does,
    and how many tokens agree before the first difference.

  gpu_vs_reference.py --dump parity.json --model SmolLM2-135M-Instruct.Q4_1.gguf
Needs torch, transformers and gguf (the GPU machine has the first two).
"""
import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(a.model), gguf_file=os.path.basename(a.model),
        torch_dtype=torch.float32).to(device).eval()
    dump = json.load(open(a.dump))
    stats = {k: {"max": 0.0, "sum": 0.0, "n": 0, "top1": 0, "greedy": 0, "prefix": 0}
             for k in ("cpu", "gpu")}
    positions = 0
    for pr in dump:
        ids = torch.tensor([pr["ids"]], device=device)
        with torch.no_grad():
            ref = torch.log_softmax(model(ids).logits[0].double(), dim=-1).cpu()
            gen = model.generate(ids, max_new_tokens=64, do_sample=False, min_new_tokens=64,
                                 attention_mask=torch.ones_like(ids))[0, ids.shape[1]:].tolist()
        for p, pos in enumerate(pr["positions"]):
            positions += 1
            ref_top = int(ref[p].argmax())
            for k in ("cpu", "gpu"):
                vals = pos[k]
                if pos["tokens"][max(range(len(vals)), key=lambda i: vals[i])] == ref_top:
                    stats[k]["top1"] += 1
                for t, v in zip(pos["tokens"][:8], vals[:8]):
                    d = abs(v - float(ref[p, t]))
                    stats[k]["max"] = max(stats[k]["max"], d)
                    stats[k]["sum"] += d
                    stats[k]["n"] += 1
        for k in ("cpu", "gpu"):
            out = pr[f"{k}_greedy"]
            stats[k]["greedy"] += out == gen
            stats[k]["prefix"] += common_prefix(out, gen)
    n = len(dump)
    print(f"float32 reference (transformers): {n} prompts, {positions} positions")
    for k in ("cpu", "gpu"):
        s = stats[k]
        print(f"{k.upper()}: top-1 = reference at {s['top1']}/{positions}; |d log-softmax| over "
              f"the top 8: max {s['max']:.4f}, mean {s['sum'] / s['n']:.5f}; greedy 64 tokens = "
              f"reference on {s['greedy']}/{n} prompts, {s['prefix'] / n:.1f} tokens in common "
              f"on average")
    agree = sum(pr["cpu_greedy"] == pr["gpu_greedy"] for pr in dump)
    print(f"GPU greedy = CPU greedy on {agree}/{n} prompts")


if __name__ == "__main__":
    main()
