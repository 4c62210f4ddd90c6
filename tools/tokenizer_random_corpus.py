#!/usr/bin/env python3
"""Writes tests/tokenizer/random_corpus.jsonl: short random strings drawn from the
characters where tokenizers tend to disagree (every Unicode space and near-space,
U+0085, U+FEFF, U+180E, ZWJ, combining marks, contractions in both cases, digits,
special-token fragments). Deterministic (fixed seed). Reference ids for it come
from tools/tokenizer_ref.js, like the hand-written corpus:

  python3 tools/tokenizer_random_corpus.py > tests/tokenizer/random_corpus.jsonl
  NODE_PATH=/tmp/tokref/node_modules node tools/tokenizer_ref.js \
      tests/tokenizer/qwen3/tokenizer.json tests/tokenizer/random_corpus.jsonl \
      > tests/tokenizer/qwen3_random_ids.jsonl
"""
import json
import random

POOL = list("abcXYZ019 '\"sStTdDlLmMvVrReE.,;!?-_()[]{}<>|/\\") + [
    "\r", "\n", "\t", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f", "\x00", "\x85", "\ufeff",
    "\u180e", "\u200b", "\u200d", "\u2028", "\u2029", "\u00a0", "\u1680", "\u2000", "\u2005",
    "\u200a", "\u202f", "\u205f", "\u3000", "\u0301", "\u0308", "\u0323", "\u00e9", "e\u0301",
    "\u4e2d", "\u6587", "\u306e", "\u30a2", "\ud55c", "\u1100", "\u1161", "\u0639", "\u0928",
    "\u093f", "\U0001F600", "\U0001F44D", "\U0001F3FD", "\u2764\ufe0f", "\u2460", "\u00b2",
    "\u00bd", "\u216b", "\u017f", "\u212a", "\u0130", "\u00df", "<|im_start|>", "<|endoftext|>",
    "<think>", "<|im_end", "  ", "   ", "\n\n", "\r\n", "1234567", "\u2019s", "'S", "'LL",
    "\U0010ffff", "\ue000", "\u0600", "\u061c", "\u00ad",
]

random.seed(7)
for _ in range(1500):
    n = random.randint(1, 25)
    print(json.dumps("".join(random.choice(POOL) for _ in range(n))))
