# Measures llama.cpp (llama-cpp-python) on the same workload as `sglrs bench executor`:
# prefill of the given prompt ids, and greedy decode at batch 1 after a short prompt.
# Usage: python llama_cpp_bench.py MODEL.gguf THREADS DECODE_STEPS REPEAT < ids.json
# ids.json: {"prefill": [...], "decode_prompt": [...]}. Prints one JSON line.
import json
import sys
import time

import llama_cpp

model, threads, steps, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ids = json.load(sys.stdin)
llm = llama_cpp.Llama(
    model_path=model,
    n_threads=threads,
    n_threads_batch=threads,
    n_ctx=4096,
    logits_all=False,
    verbose=False,
)

best_prefill = float("inf")
for _ in range(max(repeat, 1)):
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids["prefill"])
    best_prefill = min(best_prefill, time.perf_counter() - t)

best_decode = float("inf")
for _ in range(max(repeat, 1)):
    llm.reset()
    llm.eval(ids["decode_prompt"])
    tok = int(llm.scores[llm.n_tokens - 1].argmax())
    t = time.perf_counter()
    for _ in range(steps):
        llm.eval([tok])
        tok = int(llm.scores[llm.n_tokens - 1].argmax())
    best_decode = min(best_decode, time.perf_counter() - t)

print(
    json.dumps(
        {
            "prefill_tok_s": len(ids["prefill"]) / best_prefill,
            "decode_tok_s_1": steps / best_decode,
        }
    )
)
