# Sourced by the tools/lab scripts of one H200 call: the clock and progress log (el), the work
# folder W, and the dependencies carried as .deps.txz (tools/cuda_deps.sh) unpacked for make.
set -u
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/progress.log; }
W=build-cuda/q30; mkdir -p $W
[ -d .deps ] || tar xJf .deps.txz
export DEPS=$PWD/.deps LD_LIBRARY_PATH=$PWD/.deps/lib:${LD_LIBRARY_PATH:-}
