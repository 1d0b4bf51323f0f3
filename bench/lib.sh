# bench/lib.sh: what the benchmark scripts share; sourced, not run.
#
# LOCK (default /tmp/bench.lock): the anchors' lock. Timing runs hold it alone
# (`locked CMD...`); builds and instruction counts share it (`building CMD...`), so that
# nothing compiles beside a timed run. flock on fd 9, so that CMD may be a shell function.
LOCK=${LOCK:-/tmp/bench.lock}
locked() { ( flock -x 9 && "$@" ) 9>>"$LOCK"; }
building() { ( flock -s 9 && "$@" ) 9>>"$LOCK"; }

# The command line, quoted only where the shell needs it.
show() {
    local a="" x
    for x in "$@"; do
        if [[ $x =~ ^[][A-Za-z0-9_./:=,+@%^-]+$ ]]; then a+="${a:+ }$x"; else a+="${a:+ }$(printf '%q' "$x")"; fi
    done
    echo "$a"
}
