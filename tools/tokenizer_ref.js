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
// ids, encoded with add_special_tokens=false (no BOS/EOS). With --decode first,
// each output line is instead the JSON string decode(encode(line)) (special
// tokens kept), as the tokenizer's own decoder gives it.
//
// With --split-special first, the ids are those of Python's
// tokenizer(text, split_special_tokens=True) (Rust encode_special_tokens): the
// text of an added token marked special is encoded as ordinary text. The Node
// bindings lack that switch, so the special added tokens get a content no
// text holds instead (removing them would renumber the others). That is the
// same encoding as long as no non-special added token starts inside a special
// one's text (true of Qwen3's and Mistral's files: their non-special tokens all
// start with '<', which appears in a special token only as its first
// character), since encode_special_tokens passes over a special match whole.
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
  const args = process.argv.slice(2);
  const decode = args[0] === '--decode';
  if (decode) args.shift();
  const splitSpecial = args[0] === '--split-special';
  if (splitSpecial) args.shift();
  if (args.length !== 2) {
    process.stderr.write('usage: tokenizer_ref.js [--decode] [--split-special] TOKENIZER_JSON CORPUS_JSONL > OUT_JSONL\n');
    process.exit(2);
  }
  let tok;
  if (splitSpecial) {
    const json = JSON.parse(fs.readFileSync(args[0], 'utf8'));
    for (const a of json.added_tokens || [])
      if (a.special) a.content = '\u{10FFFD}\u{10FFFC}' + a.id + '\u{10FFFD}';
    tok = Tokenizer.fromString(JSON.stringify(json));
  } else {
    tok = Tokenizer.fromFile(args[0]);
  }
  const lines = fs.readFileSync(args[1], 'utf8').split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  const out = [];
  for (const line of lines) {
    const text = JSON.parse(line);
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    if (decode) out.push(JSON.stringify(await tok.decode(enc.getIds(), false)));
    else out.push(JSON.stringify(enc.getIds()));
  }
  process.stdout.write(out.join('\n') + '\n');
}
main().catch((e) => { process.stderr.write(String(e) + '\n'); process.exit(1); });
