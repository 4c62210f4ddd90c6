#!/usr/bin/env bash
# Data integrity and I/O faults end to end (issue 24), on a copy of models/kjv-moe:
#   - a byte flipped on disk in an expert blob or a core tensor: generate, logits and run exit
#     non-zero naming the file (and layer and expert, or tensor), in every experts mode
#   - reads that fail (EIO), come back short (plain and O_DIRECT), stall past the I/O timeout,
#     or bring back a corrupt copy of good bytes, injected by build/fault/shim.so (LD_PRELOAD)
#     under the CLI and under build/fault/fault_test (the library side: what the next read
#     does, what freeing a model with a stuck read does)
#   - a FIFO in place of a model file is refused at once
#   - a format-1 pack loads with one warning; verify --upgrade brings it back byte for byte
#   - verify needs every file the config needs, whatever the manifest lists
set -u
BIN=${1:-build/sluice}
FAULT=${2:-build/fault}
PY=${PYTHON:-python3}
SHIM=$(cd "$(dirname "$FAULT/shim.so")" && pwd)/shim.so
DRV=$FAULT/fault_test
. "$(dirname "$0")/../lib.sh"

# "${SH[@]}" SLUICE_FAULT_FILE=... SLUICE_FAULT=... CMD...: CMD under the shim (a command, so
# that timeout can run it).
SH=(env LD_PRELOAD="$SHIM")

# same_dir A B: every file of A is the same in B.
same_dir() {
    for f in "$1"/*; do cmp -s "$f" "$2/$(basename "$f")" || return 1; done
}

K=$TMP/kjv
cp -r models/kjv-moe "$K"
IDS=1,2,3,4,5,6,7,8
"$BIN" logits "$K" --ids $IDS --out "$TMP/ref.f32" 2>/dev/null
"$BIN" generate "$K" --ids $IDS -n 6 >"$TMP/gen.ref" 2>/dev/null
[ -s "$TMP/ref.f32" ] && [ -s "$TMP/gen.ref" ] || bad "reference run on $K"

# flip FILE OFFSET...: inverts the byte at each offset.
flip() {
    "$PY" - "$@" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    for off in map(int, sys.argv[2:]):
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
PY
}

# Offsets 1000 bytes into every expert blob of an experts file (whichever the router picks).
blob_offsets() {
    "$PY" - "$1" <<'PY'
import struct, sys
h = open(sys.argv[1], "rb").read(64)
n = struct.unpack_from("<I", h, 16)[0]
blob, data = struct.unpack_from("<QQ", h, 32)
print(" ".join(str(data + e * blob + 1000) for e in range(n)))
PY
}

# ---- a byte flipped on disk
B=$TMP/bad-expert
cp -r "$K" "$B"
flip "$B/experts-001.bin" $(blob_offsets "$B/experts-001.bin")
EXPERT_PAT='experts-001.bin: layer 1, expert [0-9][0-9]*.*checksum mismatch'
for mode in mapped resident stream; do
    expect_fail_says "flipped expert byte: generate --experts $mode" "$EXPERT_PAT" \
        "$BIN" generate "$B" --ids $IDS -n 4 --experts $mode
    expect_fail_says "flipped expert byte: logits --experts $mode" "$EXPERT_PAT" \
        "$BIN" logits "$B" --ids $IDS --out "$TMP/l.f32" --experts $mode
    expect_fail_says "flipped expert byte: run --experts $mode" "$EXPERT_PAT" \
        "$BIN" run "$B" --raw -p "And it came to pass" -n 4 --experts $mode
done
expect_fail_says "flipped expert byte: verify names layer and expert" \
    'experts-001.bin: SHA-256 mismatch.*layer 1, expert 0: checksum mismatch' "$BIN" verify "$B"

C=$TMP/bad-core
cp -r "$K" "$C"
# 10 bytes into the data of the first tensor of the index
off=$("$PY" -c 'import struct,sys; print(struct.unpack_from("<Q", open(sys.argv[1],"rb").read(300), 264)[0] + 10)' "$C/core.bin")
flip "$C/core.bin" "$off"
CORE_PAT="core.bin: tensor '[^'][^']*': checksum mismatch"
for mode in mapped resident stream; do
    expect_fail_says "flipped core byte: generate --experts $mode" "$CORE_PAT" \
        "$BIN" generate "$C" --ids $IDS -n 4 --experts $mode
done
expect_fail_says "flipped core byte: logits" "$CORE_PAT" "$BIN" logits "$C" --ids $IDS --out "$TMP/l.f32"
expect_fail_says "flipped core byte: run" "$CORE_PAT" "$BIN" run "$C" --raw -p "And it came" -n 4

# ---- reads that go wrong (the files are fine). Read 1 of an experts file is its header.
FLIP1=("${SH[@]}" SLUICE_FAULT_FILE=experts-001 SLUICE_FAULT=flip SLUICE_FAULT_AFTER=1 SLUICE_FAULT_COUNT=1)
EIO1=("${SH[@]}" SLUICE_FAULT_FILE=experts-001 SLUICE_FAULT=eio SLUICE_FAULT_AFTER=1)
EIO2=("${SH[@]}" SLUICE_FAULT_FILE=experts-002 SLUICE_FAULT=eio SLUICE_FAULT_AFTER=1)
SHORT=("${SH[@]}" SLUICE_FAULT_FILE=experts- SLUICE_FAULT=short SLUICE_FAULT_SHORT=1000)
SHORT_TOK=("${SH[@]}" SLUICE_FAULT_FILE=tokenizer.json SLUICE_FAULT=short SLUICE_FAULT_SHORT=777)
SHORT_DIRECT=("${SH[@]}" SLUICE_FAULT_FILE=experts- SLUICE_FAULT=short SLUICE_FAULT_SHORT=6000
    SLUICE_FAULT_DIRECT=1)
STALL1=("${SH[@]}" SLUICE_FAULT_FILE=experts-001 SLUICE_FAULT=stall SLUICE_FAULT_STALL_MS=1500
    SLUICE_FAULT_AFTER=1 SLUICE_FAULT_COUNT=1)
STUCK2=("${SH[@]}" SLUICE_FAULT_FILE=experts-002 SLUICE_FAULT=stall SLUICE_FAULT_STALL_MS=5000
    SLUICE_FAULT_AFTER=1)

expect_fail_says "corrupt read in flight: generate --experts stream" "$EXPERT_PAT" \
    "${FLIP1[@]}" "$BIN" generate "$K" --ids $IDS -n 4 --experts stream
if "${FLIP1[@]}" "$DRV" inflight "$K" $IDS "$TMP/ref.f32" >"$TMP/out" 2>&1; then
    ok "corrupt read in flight: refused, nothing cached, the next read clean and exact"
else
    bad "corrupt read in flight, then a clean one: $(cat "$TMP/out")"
fi
expect_fail_says "EIO: generate --experts stream" \
    'experts-001.bin: layer 1, expert [0-9][0-9]*.*Input/output error' \
    "${EIO1[@]}" "$BIN" generate "$K" --ids $IDS -n 4 --experts stream
expect_fail_says "EIO at load: --experts resident" \
    'experts-002.bin: layer 2, reading expert 0: Input/output error' \
    "${EIO2[@]}" "$BIN" generate "$K" --ids $IDS -n 4 --experts resident

if "${SHORT[@]}" "$BIN" generate "$K" --ids $IDS -n 6 --experts stream >"$TMP/gen" 2>/dev/null &&
    cmp -s "$TMP/gen" "$TMP/gen.ref"; then
    ok "short reads: retried, same output"
else
    bad "short reads: $(cat "$TMP/gen")"
fi
RUN=(run "$K" --raw -p "And it came to pass" -n 4 --seed 1)
if "${SHORT_TOK[@]}" "$BIN" "${RUN[@]}" >"$TMP/run" 2>/dev/null &&
    "$BIN" "${RUN[@]}" 2>/dev/null | cmp -s - "$TMP/run"; then
    ok "short reads of a whole file (tokenizer.json): same output"
else
    bad "short reads of tokenizer.json"
fi
# O_DIRECT: a short read ends unaligned, and its retry must read from an aligned offset (the
# shim refuses unaligned O_DIRECT reads, emulating O_DIRECT where the filesystem lacks it).
"${SHORT_DIRECT[@]}" "$DRV" readfull "$K/experts-001.bin" >"$TMP/out" 2>&1
rc=$?
if [ $rc -eq 77 ]; then
    ok "O_DIRECT short reads: skipped ($(cat "$TMP/out"))"
elif [ $rc -eq 0 ] && "${SHORT_DIRECT[@]}" "$BIN" generate "$K" --ids $IDS -n 6 --experts stream \
    --direct-io --io-engine threads >"$TMP/gen" 2>"$TMP/err" && cmp -s "$TMP/gen" "$TMP/gen.ref"; then
    ok "O_DIRECT short reads: aligned retries, same output"
else
    bad "O_DIRECT short reads: $(cat "$TMP/out" "$TMP/err")"
fi

if "${STALL1[@]}" "$DRV" stall "$K" $IDS "$TMP/ref.f32" 300 experts-001.bin 1500 >"$TMP/out" 2>&1; then
    ok "stalled read: fails within the timeout naming the file, then recovers exactly"
else
    bad "stalled read: $(cat "$TMP/out")"
fi
if "${STUCK2[@]}" "$DRV" stuck-free "$K" $IDS 300 experts-002.bin >"$TMP/out" 2>&1; then
    ok "read stuck for good: the model is freed at once"
else
    bad "read stuck for good: $(cat "$TMP/out")"
fi

# Prefetched reads that stall or fail. The shim wraps pread, which io_uring's reads never go
# through: the threads engine only (io_uring's paths: tests/unit/test_prefetch.c).
for eng in threads; do
    "${SH[@]}" SLUICE_FAULT_FILE=experts-001 SLUICE_FAULT=stall SLUICE_FAULT_STALL_MS=1500 \
        SLUICE_FAULT_AFTER=1 SLUICE_FAULT_COUNT=1 "$DRV" prefetch-stall "$K" $eng >"$TMP/out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 77 ]; then ok "stalled prefetch ($eng): $(tail -n 1 "$TMP/out")"
    else bad "stalled prefetch ($eng): $(cat "$TMP/out")"; fi
    "${SH[@]}" SLUICE_FAULT_FILE=experts-001 SLUICE_FAULT=eio SLUICE_FAULT_AFTER=1 \
        SLUICE_FAULT_COUNT=1 "$DRV" prefetch-eio "$K" $eng >"$TMP/out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 77 ]; then ok "failed prefetch ($eng): $(tail -n 1 "$TMP/out")"
    else bad "failed prefetch ($eng): $(cat "$TMP/out")"; fi
done

# Qwen4-Exp's n-gram rows go through the same readers (streamed) and carry a checksum each.
Q=$TMP/q4
if "$BIN" pack tests/fixtures/qwen4_exp_b "$Q" 2>/dev/null; then
    ng=$(cd "$Q" && ls ngram-*.bin | head -n 1)
    NG_PAT="$ng: layer [0-9][0-9]*, n-gram row [0-9][0-9]*: checksum mismatch"
    if "${SH[@]}" SLUICE_FAULT_FILE="$ng" SLUICE_FAULT=stall SLUICE_FAULT_STALL_MS=5000 \
        SLUICE_FAULT_AFTER=1 "$DRV" stuck-free "$Q" 1,2,3 300 "$ng" >"$TMP/out" 2>&1; then
        ok "stalled n-gram row read: fails naming $ng, model freed at once"
    else
        bad "stalled n-gram row read: $(cat "$TMP/out")"
    fi
    expect_fail_says "corrupt n-gram row in flight" "$NG_PAT" \
        "${SH[@]}" SLUICE_FAULT_FILE="$ng" SLUICE_FAULT=flip SLUICE_FAULT_AT=2 SLUICE_FAULT_AFTER=1 \
        "$BIN" generate "$Q" --ids 1,2,3 -n 2 --experts stream
    rows=$("$PY" -c 'import struct,sys; print(struct.unpack_from("<Q", open(sys.argv[1],"rb").read(64), 24)[0])' "$Q/$ng")
    rb=$((($(stat -c %s "$Q/$ng") - 4096) / rows))
    flip "$Q/$ng" $(seq 4098 "$rb" $((4096 + rows * rb - 1)))
    for mode in mapped stream; do
        expect_fail_says "flipped n-gram rows: generate --experts $mode" "$NG_PAT" \
            "$BIN" generate "$Q" --ids 1,2,3 -n 2 --experts $mode
    done
else
    bad "pack qwen4_exp_b"
fi

# ---- FIFOs in place of model files: refused at once, named
H=$TMP/hf
cp -r tests/fixtures/qwen2_gqa_untied "$H"
for f in config.json model.safetensors; do
    mv "$H/$f" "$H/$f.real"
    mkfifo "$H/$f"
    expect_fail_says "FIFO in place of $f" "$f: not a regular file (a FIFO)" \
        "$BIN" generate "$H" --ids 1,2 -n 1
    rm "$H/$f"
    mv "$H/$f.real" "$H/$f"
done
F=$TMP/fifo-pack
cp -r "$K" "$F"
rm "$F/experts-002.bin"
mkfifo "$F/experts-002.bin"
for mode in mapped stream; do
    expect_fail_says "FIFO in place of an experts file (--experts $mode)" \
        "experts-002.bin: not a regular file (a FIFO)" "$BIN" generate "$F" --ids 1,2 -n 1 --experts $mode
done
expect_fail_says "FIFO in place of an experts file: verify" "experts-002.bin: not a regular file" "$BIN" verify "$F"

# ---- format 1 (no checksums): loads with one warning; upgraded back byte for byte
O=$TMP/v1
cp -r "$K" "$O"
# models/kjv-moe is format 2: the round trip starts from the format pack writes now
"$BIN" verify --upgrade "$O" >/dev/null && cp -r "$O" "$TMP/kjv3"
if "$DRV" downgrade "$O" && "$BIN" generate "$O" --ids $IDS -n 6 >"$TMP/gen" 2>"$TMP/err" &&
    cmp -s "$TMP/gen" "$TMP/gen.ref" && [ "$(grep -c 'pack format 1 has no checksums' "$TMP/err")" = 1 ] &&
    "$BIN" verify "$O" | grep -q "format 1, no checksums"; then
    ok "format 1: loads with one warning, same output"
else
    bad "format 1: $(cat "$TMP/err")"
fi
if "$BIN" verify --upgrade "$O" | grep -q "upgraded from format 1 to 3" && same_dir "$TMP/kjv3" "$O"; then
    ok "verify --upgrade: the same files as pack wrote"
else
    bad "verify --upgrade"
fi
cp -r "$K" "$TMP/v1bad"
"$DRV" downgrade "$TMP/v1bad"
flip "$TMP/v1bad/experts-003.bin" 5000
expect_fail_says "verify --upgrade refuses a pack that fails verify" \
    "experts-003.bin: SHA-256 mismatch.*left as it is" "$BIN" verify --upgrade "$TMP/v1bad"

# ---- verify: what the index needs, not what the manifest lists
V=$TMP/unlisted
cp -r "$K" "$V"
"$PY" - "$V/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["files"] = [f for f in m["files"] if f["name"] != "experts-002.bin"]
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
flip "$V/experts-002.bin" 9000
expect_fail_says "verify: a file dropped from the manifest" "no entry for experts-002.bin, which layer 2 needs" \
    "$BIN" verify "$V"
rm "$V/experts-002.bin"
expect_fail_says "verify: ... and missing" "no entry for experts-002.bin" "$BIN" verify "$V"

finish "fault tests"
