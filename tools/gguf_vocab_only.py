#!/usr/bin/env python3
"""Copy a GGUF file's metadata without its tensors: a vocab-only GGUF, small enough to commit.

Usage:  PYTHONPATH=LLAMA_SRC/gguf-py python3 tools/gguf_vocab_only.py IN.gguf OUT.gguf [KEY=VALUE...]

Every key/value is copied in file order with its type; KEY=VALUE pairs replace string keys (a
pre-tokenizer name the converter got wrong, say). LLAMA_SRC is a llama.cpp source tree (gguf-py).
tests/tokenizer/demo_vocab.gguf came from tests/fixtures/demo_kjv converted with
tools/make_gguf_fixtures.py (tests/tokenizer/README.md).
"""

import sys

import gguf


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    src, dst = sys.argv[1], sys.argv[2]
    overrides = dict(a.split("=", 1) for a in sys.argv[3:])
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)  # writes general.architecture first
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if name in overrides:
            if vtype != gguf.GGUFValueType.STRING:
                sys.exit("%s: only string keys can be replaced" % name)
            value = overrides.pop(name)
        w.add_key_value(name, value, vtype, sub)
    if overrides:
        sys.exit("keys not in %s: %s" % (src, ", ".join(overrides)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


if __name__ == "__main__":
    main()
