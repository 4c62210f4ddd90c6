set -x
cd tools
mkdir -p /tmp/fx
names=$(python3 -c 'import sys; sys.argv=["x"]; import make_fixtures_fam as m; print(" ".join(c["name"] for c in m.CASES))' 2>/dev/null)
echo "cases: $names"
for n in $names; do
  ( FX_THREADS=2 timeout 420 python3 make_fixtures_fam.py /tmp/fx/$n --only $n > /tmp/fx/$n.log 2>&1 ) &
done
wait
cd /tmp/fx && tar czf $OUT/fx.tgz . && ls -la $OUT
