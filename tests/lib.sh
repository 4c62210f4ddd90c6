# The helpers the shell suites share, sourced by tests/cli_test.sh, tests/server/server_test.sh
# and tests/fault/fault_test.sh:
#
#   TMP            a scratch directory, removed at exit
#   PIDS           background processes (servers) killed at exit: PIDS+=("$!")
#   ok NAME        counts a check that passed; bad NAME counts one that failed
#   expect_fail    a command that fails by itself with one clear error line
#   expect_fail_says   ... with a line saying something among others
#   finish LABEL   the summary line; the suite's exit status
#
# Patterns are grep's basic regular expressions: ( ) | + ? are plain characters, [0-9][0-9]*
# is one or more digits.
TMP=$(mktemp -d)
PIDS=()
pass=0
fail=0

lib_cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap lib_cleanup EXIT

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# A command that must fail exits non-zero by itself: no signal, and within this many seconds
# (timeout's 124, and 128 + a signal, are not failures the program chose).
EXPECT_TIMEOUT=${EXPECT_TIMEOUT:-20}

# expect_fail NAME PATTERN CMD...: CMD (a program, not a shell function) exits non-zero by
# itself, and its stderr is exactly one line, matching PATTERN: the command line's contract of
# one clear error line.
expect_fail() {
    local name=$1 pat=$2
    shift 2
    timeout "$EXPECT_TIMEOUT" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 124 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
        grep -q -- "$pat" "$TMP/err"; then
        ok "$name"
    else
        bad "$name (rc=$rc, stderr: $(head -c 400 "$TMP/err"))"
    fi
}

# expect_fail_says NAME PATTERN CMD...: as expect_fail, but stderr may hold other lines too
# (warnings, progress) as long as one matches PATTERN.
expect_fail_says() {
    local name=$1 pat=$2
    shift 2
    timeout "$EXPECT_TIMEOUT" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "$pat" "$TMP/err"; then
        ok "$name"
    else
        bad "$name (rc=$rc, stderr: $(head -c 400 "$TMP/err"))"
    fi
}

# finish LABEL [MORE]: "LABEL: N passed, M failed[, MORE]", and the status of the suite.
finish() {
    echo "$1: $pass passed, $fail failed${2:+, $2}"
    [ "$fail" -eq 0 ]
}
