#!/usr/bin/env bash
# The routing model's training text (tools/train_router_model.py): freely licensed prose and
# technical writing from Debian packages, as documents of different kinds, so that the routers
# have domains to specialise on:
#   bible-kjv        the King James Bible (public domain), a document per 300 verses
#   python3.11-doc   the Python 3.11 documentation's reStructuredText sources (PSF licence)
#   perl-doc         Perl's POD manuals (Artistic / GPL)
#   debian-policy, developers-reference   Debian Policy and the Developer's Reference (GPL)
# Every 40th document of each kind is held out (for perplexity and the routing traces).
#
#   tools/prepare_corpus.sh OUTDIR   -> OUTDIR/train.txt, OUTDIR/heldout.txt: documents
#                                       separated by a line holding only <|endoftext|>
set -euo pipefail
out=${1:?usage: tools/prepare_corpus.sh OUTDIR}
need=()
command -v bible >/dev/null || need+=(bible-kjv bible-kjv-text)
[ -d /usr/share/doc/python3.11/html/_sources ] || need+=(python3.11-doc)
[ -d /usr/share/perl/5.36/pod ] || need+=(perl-doc)
[ -e /usr/share/doc/debian-policy/policy.txt.gz ] || need+=(debian-policy)
[ -d /usr/share/doc/developers-reference ] || need+=(developers-reference)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bible -f "Ge1:1-Re22:21" | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' > "$tmp/kjv.txt"
/usr/bin/python3 - "$tmp/kjv.txt" "$out" <<'PY'
import glob, gzip, os, sys
kjv, out = sys.argv[1], sys.argv[2]
docs = {}
verses = [l.rstrip("\n") for l in open(kjv, encoding="utf-8") if l.strip()]
docs["kjv"] = ["\n".join(verses[i:i + 300]) for i in range(0, len(verses), 300)]
def files(pattern):
    return sorted(glob.glob(pattern, recursive=True))
def read(p):
    op = gzip.open if p.endswith(".gz") else open
    with op(p, "rt", encoding="utf-8", errors="replace") as f:
        return f.read()
docs["python"] = [read(p) for p in files("/usr/share/doc/python3.11/html/_sources/**/*.rst.txt")]
docs["perl"] = [read(p) for p in files("/usr/share/perl/5.36/pod/*.pod")]
docs["debian"] = [read(p) for p in files("/usr/share/doc/debian-policy/*.txt.gz")] + \
    [read(p) for p in files("/usr/share/doc/developers-reference/**/*.txt*")]
train, held_by_kind = [], []
for kind, ds in docs.items():
    ds = [d.strip() for d in ds if len(d.strip()) > 200]
    held_by_kind.append([d for i, d in enumerate(ds) if i % 40 == 20])
    train += [d for i, d in enumerate(ds) if i % 40 != 20]
    print("%-7s %5d documents, %6.1f MB" % (kind, len(ds), sum(len(d) for d in ds) / 1e6))
# the held-out kinds in turn, so that a trace crosses domains the way a chat session does
held = [hk[i] for i in range(max(map(len, held_by_kind))) for hk in held_by_kind if i < len(hk)]
for name, ds in (("train", train), ("heldout", held)):
    with open(os.path.join(out, name + ".txt"), "w", encoding="utf-8") as f:
        f.write("\n<|endoftext|>\n".join(ds) + "\n")
    print("%s: %d documents, %.1f MB" % (name, len(ds), sum(len(d) for d in ds) / 1e6))
PY
