#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF with seeded random weights for tests/engine.rs.

The tokenizer (tokenizer.ggml.* and a ChatML tokenizer.chat_template) is copied from the
llama.cpp tree's models/ggml-vocab-qwen2.gguf, written with the tree's own gguf-py. The
weights are random, except for one thing that makes the model's output predictable enough to
measure: every generated token is one of a fixed set of "safe" tokens, a space and 2-10 ASCII
lowercase letters (" the", " and", ...).

- Each safe token is complete UTF-8 text on its own, so llama.cpp never holds a token back
  (it withholds incomplete UTF-8) and never sends an empty piece (special tokens render as
  nothing): every streamed chunk carries exactly one token.
- End-of-generation tokens (<|endoftext|>, <|im_end|>) are never sampled, so generation always
  runs to max_tokens (finish_reason "length"), with no request field needed.

How: dimension 0 of every token embedding is 1.0 and the other dimensions are small, and the
layers' weights are small, so after the final RMSNorm dimension 0 of the hidden state is about
sqrt(n_embd) whatever the context. The output matrix's rows are zero except for the safe
tokens, whose dimension-0 weight gives them a logit of about BONUS (+ noise); every other
token's logit is exactly 0. With BONUS = 32 the other 150k tokens together have a probability
below 1e-12 per token at temperature 1 with no top-k/top-p/min-p, about 1e-5 at temperature 2,
and the server's default samplers (top-k 40, min-p 0.05) cut them altogether.
tests/engine.rs checks both properties on every request it makes; verify_model.py checks them
on 400 streams under four samplers.

Size: the vocabulary is 151,936 tokens, so the two vocabulary matrices dominate: with
n_embd = 128 in f16 they are 2 x 39 MB (84 MB in all with the tokenizer), and one token takes
about 2.6 ms with one thread (n_embd = 64: 1.3 ms).

A slower model of the same kind (--slow: n_embd 512, 8 layers, 8 heads / 4 KV heads, n_ff 1536,
about 350 MB, about four times slower per token) lets a request stay in the engine long enough
for the races between a kept-alive connection's close and the next request to show
(tests/engine.rs, the back-to-back tests).

Usage: make_model.py --tree <llama.cpp source tree> --out model.gguf [--seed 20261123] [--slow]
"""

import argparse
import re
import sys
from pathlib import Path

import numpy as np

N_EMBD = 128
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 256
N_CTX_TRAIN = 4096
BONUS = 32.0
N_SAFE = 2048
SAFE = re.compile(r"^\u0120[a-z]{2,10}$")  # byte-level BPE: \u0120 ("Ġ") is the space byte


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", required=True, type=Path, help="llama.cpp source tree")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--slow", action="store_true", help="the slower model (see above)")
    args = ap.parse_args()
    global N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF
    if args.slow:
        N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 512, 8, 8, 4, 1536

    sys.path.insert(0, str(args.tree / "gguf-py"))
    import gguf  # noqa: E402  (from the tree, so the format matches the server built from it)

    vocab = gguf.GGUFReader(args.tree / "models" / "ggml-vocab-qwen2.gguf")
    tokens = vocab.fields["tokenizer.ggml.tokens"].contents()
    types = vocab.fields["tokenizer.ggml.token_type"].contents()
    n_vocab = len(tokens)
    normal = int(gguf.TokenType.NORMAL)
    safe = [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == normal and SAFE.match(t)]
    safe = np.array(safe[:N_SAFE], dtype=np.int64)
    assert len(safe) == N_SAFE, f"only {len(safe)} safe tokens in the vocabulary"

    rng = np.random.default_rng(args.seed)
    f16 = np.float16

    w = gguf.GGUFWriter(str(args.out), "llama")
    w.add_name("tokenmeter-tiny-random")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(n_vocab)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    # The tokenizer, as is: model gpt2, pre qwen2, tokens, types, merges, special ids, template.
    for key, field in vocab.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub)

    def normal_(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    embd = normal_((n_vocab, N_EMBD), 0.02)
    embd[:, 0] = 1.0
    w.add_tensor("token_embd.weight", embd.astype(f16))
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name, shape in [
            ("attn_q", (N_EMBD, N_EMBD)),
            ("attn_k", (N_EMBD // N_HEAD * N_HEAD_KV, N_EMBD)),
            ("attn_v", (N_EMBD // N_HEAD * N_HEAD_KV, N_EMBD)),
            ("attn_output", (N_EMBD, N_EMBD)),
        ]:
            w.add_tensor(f"blk.{i}.{name}.weight", normal_(shape, 0.02).astype(f16))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", normal_((N_FF, N_EMBD), 0.02).astype(f16))
        w.add_tensor(f"blk.{i}.ffn_up.weight", normal_((N_FF, N_EMBD), 0.02).astype(f16))
        w.add_tensor(f"blk.{i}.ffn_down.weight", normal_((N_EMBD, N_FF), 0.02).astype(f16))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    # After the final norm, dimension 0 is about sqrt(N_EMBD); the rest are about 0.2 each.
    out = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    h0 = np.sqrt(N_EMBD)
    out[safe, 0] = (BONUS + rng.standard_normal(len(safe)).astype(np.float32) * 1.5) / h0
    out[safe, 1:] = normal_((len(safe), N_EMBD - 1), 0.5)
    w.add_tensor("output.weight", out.astype(f16))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = args.out.stat().st_size
    print(
        f"make_model.py: {args.out}: llama, n_embd {N_EMBD}, {N_LAYER} layers, {N_HEAD} heads, "
        f"n_ff {N_FF}, vocab {n_vocab} ({N_SAFE} safe tokens), seed {args.seed}, "
        f"{size / 1e6:.1f} MB",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
