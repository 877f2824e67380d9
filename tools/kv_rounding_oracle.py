#!/usr/bin/env python3
"""What storing K and V in a cache type costs, measured outside hablar: the default model in
transformers (float32), its keys (after RoPE) and values rounded through the type before
attention, as a KV cache of that type would hand them back. Perplexity over positions
ctx/2 .. ctx-2 of a text (as bench/cpu/kv_agreement scores them) and the share of those
positions whose top-1 token is the F16 cache's.

Types: f16, bf16, q8_0 (llama.cpp's blocks of 32: d = max|x| / 127 as a half, codes rounded
half to even), e4m3 (fp8, no scale, saturating at +-448, as cvt.rn.satfinite does) and
e4m3-row (fp8 codes of x / s per head row, s = max|x| / 448 kept in f16). The q8_0 row
checks the method against hablar's own measurement (bench/cpu/kv_agreement); the e4m3 rows
answer what an fp8 cache would cost before one is built.

Usage: .venv/bin/python tools/kv_rounding_oracle.py --model DIR --text FILE [--ctx 4096]
(DIR: a Hugging Face checkpoint, e.g. the default model's float32 twin that
tools/make_hf_twin.py writes to ~/.cache/hablar/hf/SmolLM2-135M-Instruct.Q4_1-float32)
"""
import argparse
import math

import torch
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def round_f16(x):
    return x.to(torch.float16).to(torch.float32)


def round_bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def round_q8_0(x):
    shape = x.shape
    b = x.reshape(*shape[:-1], shape[-1] // 32, 32)
    amax = b.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    codes = torch.round(b * inv)  # torch.round: half to even
    d = (amax / 127.0).to(torch.float16).to(torch.float32)
    return (codes * d).reshape(shape)


def round_e4m3(x):
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)


def round_e4m3_row(x):
    amax = x.abs().amax(dim=-1, keepdim=True)
    s = (amax / 448.0).to(torch.float16).to(torch.float32)
    s = torch.where(s > 0, s, torch.ones_like(s))
    return round_e4m3(x / s) * s


ROUNDINGS = {"f16": round_f16, "bf16": round_bf16, "q8_0": round_q8_0, "e4m3": round_e4m3,
             "e4m3-row": round_e4m3_row}
current = {"round": round_f16}


def rounded_attention(module, query, key, value, attention_mask, **kwargs):
    r = current["round"]
    return sdpa_attention_forward(module, query, r(key.float()).to(key.dtype),
                                  r(value.float()).to(value.dtype), attention_mask, **kwargs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    AttentionInterface.register("kv_rounded", rounded_attention)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                 attn_implementation="kv_rounded").eval()
    ids = tok(open(a.text, encoding="utf-8").read(), add_special_tokens=True)["input_ids"]
    ids = torch.tensor([ids[:a.ctx]])
    first, last = a.ctx // 2, a.ctx - 2  # positions scored: their next token
    base_top1 = None
    print(f"{a.ctx} tokens, positions {first}..{last} scored\n")
    print("| KV rounding | perplexity | vs F16 | top-1 same as F16 |")
    print("| --- | ---: | ---: | ---: |")
    base_ppl = None
    for name, fn in ROUNDINGS.items():
        current["round"] = fn
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        lsm = torch.log_softmax(logits[first:last + 1], dim=-1)
        nll = -lsm.gather(1, ids[0, first + 1:last + 2].unsqueeze(1)).squeeze(1)
        ppl = math.exp(nll.mean().item())
        top1 = logits[first:last + 1].argmax(dim=-1)
        if base_top1 is None:
            base_top1, base_ppl = top1, ppl
        same = int((top1 == base_top1).sum())
        n = top1.numel()
        print(f"| {name} | {ppl:.4f} | {100 * (ppl / base_ppl - 1):+.2f}% | {same} / {n} "
              f"({100 * same / n:.2f}%) |", flush=True)


if __name__ == "__main__":
    main()
