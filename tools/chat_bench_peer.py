#!/usr/bin/env python3
"""The peer of bench/chat: Python jinja2 rendering the same templates with the same context, as
Hugging Face's apply_chat_template does (compiled template reused across calls).

Prints one JSON object: {template name: CPU microseconds per render} (process time, so that a
shared machine's load does not count).
Usage: python tools/chat_bench_peer.py CONTEXT_JSON TEMPLATE_FILE...
"""
import json
import os
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_golden import make_environment  # noqa: E402


def main():
    context_path, template_paths = sys.argv[1], sys.argv[2:]
    with open(context_path, encoding="utf-8") as f:
        context = json.load(f)
    env = make_environment()
    results = {}
    for path in template_paths:
        with open(path, encoding="utf-8") as f:
            template = env.from_string(f.read())
        template.render(**context)
        runs, total = 0, 0.0
        while total < 0.5:
            total += timeit.timeit(lambda: template.render(**context), number=20,
                                   timer=time.process_time)
            runs += 20
        results[os.path.splitext(os.path.basename(path))[0]] = total / runs * 1e6
    print(json.dumps(results))


if __name__ == "__main__":
    main()
