# Writes a damaged copy of a GGUF fixture for the error tests (tests/cli_test.sh):
#   gguf_mutate.py SRC DST embd|experts|arch|type|cut|qsa
# embd/experts: metadata that disagrees with the tensors; arch: an architecture sluice does
# not run; type: an unknown ggml type id; cut: the last 1000 bytes gone; qsa: Qwen4-Exp's last
# layer given compress ratio 4 (what its converter writes for a layer transformers calls
# full_attention), so that its QSA indexer runs.
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
elif what == "cut":
    b = b[: len(b) - 1000]
open(dst, "wb").write(b)
