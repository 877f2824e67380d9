#!/usr/bin/env python3
"""The table of bench/gpu/compare.sh: hablar beside llama.cpp on the same GGUF and GPU.

  compare_table.py --dir OUT --shape qwen2.5-1.5b   figures of one shape, with ratios and the
                                                   batch-1 decode as a share of the bound that
                                                   the GPU's copy bandwidth sets
  compare_table.py --ncu ncu.csv                   ncu kernel times summed by kernel name
  compare_table.py --ncu-steps ncu.csv             the same for the last prompt step and the
                                                   mean decode step after it
"""
import argparse
import collections
import csv
import json
import pathlib


def json_lines(path):
    rows = []
    for line in pathlib.Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def copy_bandwidth_gbs():
    """Device-to-device copy of 1 GiB, best of 5 (bytes read + written per second / 2)."""
    try:
        import torch
    except ImportError:
        return None
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    best = 0.0
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        torch.cuda.synchronize()
        best = max(best, 2 * a.numel() / (start.elapsed_time(end) / 1e3) / 1e9)
    return best


def table(out, shape):
    d = pathlib.Path(out)
    llama = json.loads((d / f"{shape}-llama-bench.json").read_text())
    ours = json.loads((d / f"{shape}-hablar-bench.json").read_text())
    # The decode-at-depth rows, where the run made them.
    for name, into in (("llama-bench-depth", llama), ("hablar-bench-depth", ours)):
        path = d / f"{shape}-{name}.json"
        if path.exists() and path.stat().st_size > 0:
            into.extend(json.loads(path.read_text()))
    rows = []

    def llama_ts(n_prompt, n_gen, n_depth, fa):
        for r in llama:
            if (r["n_prompt"] == n_prompt and r["n_gen"] == n_gen and
                    r.get("n_depth", 0) == n_depth and bool(r["flash_attn"]) == fa):
                return r["avg_ts"]
        return None

    weight_bytes = ours[0].get("weight_bytes_per_token", 0)
    bw = copy_bandwidth_gbs()
    for r in ours:
        key = (r["n_prompt"], r["n_gen"], r.get("n_depth", 0))
        fa0, fa1 = llama_ts(*key, False), llama_ts(*key, True)
        best = max(v for v in (fa0, fa1) if v) if (fa0 or fa1) else None
        note = ""
        if r["n_gen"] > 0 and r.get("n_depth", 0) == 0 and bw and weight_bytes:
            bound = bw * 1e9 / weight_bytes
            note = f"{100 * r['avg_ts'] / bound:.0f}% of the {bound:,.0f} t/s copy bound"
        rows.append((r["test"], r["avg_ts"], fa0, fa1, best, note))
    batched_ll = {r["pl"]: r for r in json_lines(d / f"{shape}-llama-batched.jsonl")}
    batched_us = {r["pl"]: r for r in json.loads((d / f"{shape}-hablar-batched.json").read_text())}
    print(f"## {shape}, Q4_K_M" + (f" (device copy bandwidth {bw:,.0f} GB/s)" if bw else ""))
    print("| test | hablar t/s | llama.cpp -fa 0 | llama.cpp -fa 1 | ratio to best | note |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, v, fa0, fa1, best, note in rows:
        ratio = f"{v / best:.2f}x" if best else "-"
        fmt = lambda x: f"{x:,.0f}" if x else "-"
        print(f"| {name} | {v:,.0f} | {fmt(fa0)} | {fmt(fa1)} | {ratio} | {note} |")
    print()
    print("| parallel sequences (128 + 128 each) | hablar S_TG t/s | llama.cpp S_TG t/s | ratio |"
          " hablar S_PP t/s | llama.cpp S_PP t/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for pl in sorted(set(batched_ll) | set(batched_us)):
        u, l = batched_us.get(pl), batched_ll.get(pl)
        us_tg, ll_tg = (u["speed_tg"] if u else None), (l["speed_tg"] if l else None)
        ratio = f"{us_tg / ll_tg:.2f}x" if us_tg and ll_tg else "-"
        fmt = lambda x: f"{x:,.0f}" if x else "-"
        print(f"| {pl} | {fmt(us_tg)} | {fmt(ll_tg)} | {ratio} | {fmt(u and u['speed_pp'])} |"
              f" {fmt(l and l['speed_pp'])} |")


def ncu_kernels(path):
    """(kernel name, microseconds) of an ncu CSV (gpu__time_duration.sum), in launch order."""
    lines = pathlib.Path(path).read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    for r in csv.DictReader(lines[start:]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        # "void hablar::cuda::(anonymous namespace)::kernel<...>(...)": the kernel's own name
        name = r["Kernel Name"].replace("void ", "", 1)
        for anon in ("(anonymous namespace)::", "<unnamed>::"):
            name = name.replace(anon, "")
        name = name.split("(")[0].split("<")[0]
        value = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(r.get("Metric Unit"), 1e-3)
        yield name, value * scale


def print_shares(kernels, steps=1):
    total = collections.Counter()
    count = collections.Counter()
    for name, us in kernels:
        total[name] += us / steps
        count[name] += 1
    all_us = sum(total.values())
    print(f"{sum(count.values()) / steps:.0f} kernels, {all_us:,.1f} us in all")
    for name, us in total.most_common():
        print(f"{us:10.1f} us {100 * us / all_us:5.1f}%  x{count[name] / steps:<5g} {name}")


def ncu_summary(path):
    print_shares(list(ncu_kernels(path)))


def ncu_steps(path):
    """Per-step shares of the last prompt step and the decode steps after it: a step begins at
    each embedding lookup; a prompt step is one that runs the flash prefill attention."""
    steps = []
    for name, us in ncu_kernels(path):
        if name.endswith("embedding_kernel") or not steps:
            steps.append([])
        steps[-1].append((name, us))
    prompt = [i for i, st in enumerate(steps) if any("prefill_attention" in n for n, _ in st)]
    if prompt:
        print(f"== the last prompt step (of {len(prompt)})")
        print_shares(steps[prompt[-1]])
    decode = steps[prompt[-1] + 1:] if prompt else []
    if decode:
        print(f"== decode steps after it: mean of {len(decode)}")
        print_shares([k for st in decode for k in st], len(decode))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir")
    ap.add_argument("--shape")
    ap.add_argument("--ncu")
    ap.add_argument("--ncu-steps")
    a = ap.parse_args()
    if a.ncu_steps:
        ncu_steps(a.ncu_steps)
    elif a.ncu:
        ncu_summary(a.ncu)
    else:
        table(a.dir, a.shape)


if __name__ == "__main__":
    main()
