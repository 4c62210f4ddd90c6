#!/usr/bin/env python3
"""Convert sluice's Hugging Face test fixtures to GGUF with llama.cpp's own converter.

Usage:  python3 tools/make_gguf_fixtures.py LLAMA_SRC OUTDIR FIXTURE_DIR...

LLAMA_SRC is a llama.cpp source tree (convert_hf_to_gguf.py, conversion/, gguf-py/), e.g. the
one the npm package node-llama-cpp carries (../shared/bench/README.md). Needs torch,
transformers and numpy, so it runs on the GPU machine.

For each fixture it writes OUTDIR/<fixture>/{f32,bf16}.gguf (convert_hf_to_gguf.py --outtype)
and OUTDIR/<fixture>/log.txt (bf16 only for a fixture over 5 MB). A fixture without tokenizer.json gets a byte-level BPE tokenizer
(the first min(256, vocab_size) bytes one token each, no merges) with Qwen2's pre-tokenizer, so
that the converter has a vocabulary to write. The converter recognises a pre-tokenizer by a
hash of how it splits a test text; an unknown one is written as "gpt-2" when it is a plain
ByteLevel pre-tokenizer (the demo model's), else "qwen2" (the tiny tokenizers here, Qwen2's
Split), a known one as what the converter says.

--vocab-only NAME:TOKENIZER_DIR:CONFIG_DIR writes OUTDIR/NAME/vocab.gguf, the converter's
--vocab-only output for the tokenizer files of TOKENIZER_DIR with the config.json of CONFIG_DIR
(its vocab_size raised to cover the tokenizer, rounded up to a multiple of 256).
"""

import json
import os
import shutil
import sys
import tempfile
import traceback

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_byte_tokenizer(d, n):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(n)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "add_bos_token": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": 512,
                "chat_template": CHATML,
            },
            f,
            indent=1,
        )


def patch_converter():
    from conversion import base

    orig = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return orig(self, tokenizer)
        except NotImplementedError:
            # GPT-2's pre-tokenizer is a plain ByteLevel one with its own regex; the byte
            # tokenizers this script writes use Qwen2's Split.
            with open(os.path.join(self.dir_model, "tokenizer.json")) as f:
                pre = json.load(f).get("pre_tokenizer") or {}
            return "gpt-2" if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) else "qwen2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre


def convert(args, log):
    import convert_hf_to_gguf as conv

    saved = sys.argv
    sys.argv = ["convert_hf_to_gguf.py"] + args
    try:
        conv.main()
        log.write("ok: %s\n" % " ".join(args))
        return True
    except BaseException:
        log.write("FAILED: %s\n%s\n" % (" ".join(args), traceback.format_exc()))
        return False
    finally:
        sys.argv = saved


def main():
    argv = sys.argv[1:]
    vocab_only = []
    while "--vocab-only" in argv:
        i = argv.index("--vocab-only")
        vocab_only.append(argv[i + 1])
        del argv[i : i + 2]
    if len(argv) < 2:
        print(__doc__)
        sys.exit(2)
    src, out = argv[0], argv[1]
    sys.path[:0] = [src, os.path.join(src, "gguf-py")]
    patch_converter()
    os.makedirs(out, exist_ok=True)
    for fx in argv[2:]:
        name = os.path.basename(fx.rstrip("/"))
        od = os.path.join(out, name)
        os.makedirs(od, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp, open(os.path.join(od, "log.txt"), "w") as log:
            d = os.path.join(tmp, name)
            shutil.copytree(fx, d)
            if not os.path.exists(os.path.join(d, "tokenizer.json")):
                with open(os.path.join(d, "config.json")) as f:
                    cfg = json.load(f)
                write_byte_tokenizer(d, min(256, cfg.get("text_config", cfg)["vocab_size"]))
            big = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) > (5 << 20)
            for t in ("bf16",) if big else ("f32", "bf16"):
                a = [d, "--outtype", t, "--outfile", os.path.join(od, t + ".gguf")]
                # Qwen3.5 configs without MTP layers need --no-mtp; other families refuse it.
                convert(a, log) or convert(a + ["--no-mtp"], log)
        print(name, open(os.path.join(od, "log.txt")).read().count("ok:"), "converted", flush=True)
    for spec in vocab_only:
        name, tokdir, cfgdir = spec.split(":")
        od = os.path.join(out, name)
        os.makedirs(od, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp, open(os.path.join(od, "log.txt"), "w") as log:
            d = os.path.join(tmp, name)
            os.makedirs(d)
            with open(os.path.join(cfgdir, "config.json")) as f:
                cfg = json.load(f)
            with open(os.path.join(tokdir, "tokenizer.json")) as f:
                tj = json.load(f)
            n = 1 + max(list(tj["model"]["vocab"].values()) + [t["id"] for t in tj["added_tokens"]])
            cfg["vocab_size"] = max(cfg["vocab_size"], (n + 255) // 256 * 256)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
            for f in os.listdir(tokdir):
                if f.startswith("tokenizer"):
                    shutil.copy(os.path.join(tokdir, f), d)
            if not os.path.exists(os.path.join(d, "tokenizer_config.json")):
                with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                    json.dump(
                        {
                            "tokenizer_class": "PreTrainedTokenizerFast",
                            "eos_token": "<|im_end|>",
                            "pad_token": "<|endoftext|>",
                            "add_bos_token": False,
                            "chat_template": CHATML,
                        },
                        f,
                    )
            convert([d, "--vocab-only", "--outfile", os.path.join(od, "vocab.gguf")], log)
        print(name, "vocab", flush=True)


if __name__ == "__main__":
    main()
