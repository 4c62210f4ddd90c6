#!/usr/bin/env node
// Reference token ids from Hugging Face's own Rust tokenizers (npm package
// `tokenizers` 0.23.x, the official Node bindings; ids identical to the Python
// package). Not a build dependency: install it outside the repository, e.g.
//
//   mkdir -p /tmp/tokref && (cd /tmp/tokref && npm install tokenizers@0.23)
//   NODE_PATH=/tmp/tokref/node_modules node tools/tokenizer_ref.js \
//       tests/tokenizer/qwen3/tokenizer.json tests/tokenizer/corpus.jsonl > tests/tokenizer/qwen3_ids.jsonl
//
// Each corpus line is one JSON string; each output line is the JSON array of its
// ids, encoded with add_special_tokens=false (no BOS/EOS).
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
  if (process.argv.length !== 4) {
    process.stderr.write('usage: tokenizer_ref.js TOKENIZER_JSON CORPUS_JSONL > IDS_JSONL\n');
    process.exit(2);
  }
  const tok = Tokenizer.fromFile(process.argv[2]);
  const lines = fs.readFileSync(process.argv[3], 'utf8').split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  const out = [];
  for (const line of lines) {
    const text = JSON.parse(line);
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    out.push(JSON.stringify(enc.getIds()));
  }
  process.stdout.write(out.join('\n') + '\n');
}
main().catch((e) => { process.stderr.write(String(e) + '\n'); process.exit(1); });
