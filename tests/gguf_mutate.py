# Writes a damaged copy of a GGUF fixture for the error tests (tests/cli_test.sh):
#   gguf_mutate.py SRC DST embd|experts|arch|type|cut|qsa|mtp|eos
# embd/experts: metadata that disagrees with the tensors; arch: an architecture sluice does
# not run; type: an unknown ggml type id; cut: the last 1000 bytes gone; qsa: Qwen4-Exp's last
# layer given compress ratio 4 (what its converter writes for a layer transformers calls
# full_attention), so that its QSA indexer runs; mtp: one more block, counted as an MTP layer
# (nextn_predict_layers 1, what the converter writes when it appends one), so the same model;
# eos (not damage): an eos id (7) and a sampling temperature (0.625) added to the metadata.
import struct, sys
src, dst, what = sys.argv[1], sys.argv[2], sys.argv[3]
b = bytearray(open(src, "rb").read())
def key_value_at(key):
    k = key.encode()
    i = b.find(struct.pack("<Q", len(k)) + k)
    assert i >= 0, key
    return i + 8 + len(k) + 4  # past the value type
if what == "embd":
    struct.pack_into("<I", b, key_value_at("qwen3moe.embedding_length"), 48)
elif what == "experts":
    struct.pack_into("<I", b, key_value_at("qwen3moe.expert_count"), 17)
elif what == "arch":
    i = key_value_at("general.architecture")
    b[i + 8:i + 16] = b"llama99x"
elif what == "type":
    n = b"blk.0.attn_q.weight"
    i = b.find(struct.pack("<Q", len(n)) + n) + 8 + len(n)
    nd = struct.unpack_from("<I", b, i)[0]
    struct.pack_into("<I", b, i + 4 + 8 * nd, 99)
elif what == "qsa":
    i = key_value_at("qwen4exp.attention.compress_ratios")
    n = struct.unpack_from("<Q", b, i + 4)[0]
    struct.pack_into("<i", b, i + 12 + 4 * (n - 1), 4)
elif what == "mtp":
    # Insert the key after the last one (and a padding string: what is inserted stays a whole
    # number of alignment units, so the tensors' offsets still hold).
    i = key_value_at("general.architecture")
    arch = b[i + 8:i + 8 + struct.unpack_from("<Q", b, i)[0]].decode()
    bc = key_value_at(arch + ".block_count")
    struct.pack_into("<I", b, bc, struct.unpack_from("<I", b, bc)[0] + 1)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    def skip(at, t):
        if t == 8:
            return at + 8 + struct.unpack_from("<Q", b, at)[0]
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, at)
            at += 12
            if et == 8:
                for _ in range(n):
                    at = skip(at, 8)
                return at
            return at + n * sizes[et]
        return at + sizes[t]
    n_kv = struct.unpack_from("<Q", b, 16)[0]
    at = 24
    for _ in range(n_kv):
        at += 8 + struct.unpack_from("<Q", b, at)[0]
        t = struct.unpack_from("<I", b, at)[0]
        at = skip(at + 4, t)
    def kv(key, t, val):
        k = key.encode()
        return struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + val
    ins = kv(arch + ".nextn_predict_layers", 4, struct.pack("<I", 1))
    pad = kv("sluice.pad", 8, struct.pack("<Q", 0))
    extra = (-(len(ins) + len(pad))) % 32
    ins += kv("sluice.pad", 8, struct.pack("<Q", extra) + b"x" * extra)
    b[at:at] = ins
    struct.pack_into("<Q", b, 16, n_kv + 2)
elif what == "cut":
    b = b[: len(b) - 1000]
elif what == "eos":
    def kv(key, vtype, value):
        k = key.encode()
        return struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype) + value
    add = kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 7))
    add += kv("general.sampling.temp", 6, struct.pack("<f", 0.625))
    # a string of padding: the data section keeps its alignment (32) when the insertion is a
    # multiple of it
    fixed = len(kv("sluice.pad", 8, struct.pack("<Q", 0)))
    pad = (-(len(add) + fixed)) % 32
    add += kv("sluice.pad", 8, struct.pack("<Q", pad) + b" " * pad)
    n_kv = struct.unpack_from("<Q", b, 16)[0]
    struct.pack_into("<Q", b, 16, n_kv + 3)
    b = b[:24] + add + b[24:]
open(dst, "wb").write(b)
