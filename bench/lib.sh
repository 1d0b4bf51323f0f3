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

# mgmt_up MG CLUSTER N: a management namespace MG joined to node k of emulated cluster
# CLUSTER (N nodes) by a veth of its own (10.79.k+1.0/24), for mpirun's PMIx traffic
# only (the nodes' own links carry the MPI traffic). Remove it with `ip netns del MG`.
mgmt_up() {
    local mg=$1 cl=$2 n=$3 k
    ip netns del "$mg" 2>/dev/null
    ip netns add "$mg" && ip -n "$mg" link set lo up || return 1
    for k in $(seq 0 $((n - 1))); do
        local ns=qv-$cl-n$k net=10.79.$((k + 1))
        ip link add "qvbm$k" netns "$mg" type veth peer name qvbm netns "$ns" &&
        ip -n "$mg" addr add "$net.1/24" dev "qvbm$k" && ip -n "$mg" link set "qvbm$k" up &&
        ip -n "$ns" addr add "$net.2/24" dev qvbm && ip -n "$ns" link set qvbm up &&
        ip -n "$ns" route add 10.79.0.0/16 via "$net.1" || return 1
    done
    sleep 0.5
}

# mpi_on_cluster MG CLUSTER N PROG ARGS...: sets MPI_CMD to the command that runs PROG
# with Open MPI (ob1 over tcp on the cluster's links, one rank per node, launched from
# MG, see mgmt_up).
mpi_on_cluster() {
    local mg=$1 cl=$2 n=$3 k subnet; shift 3
    subnet=$(ip -n "qv-$cl-n0" -4 -o addr show qv0 | awk '{print $4}' | head -1)
    subnet=$(python3 -c "import ipaddress,sys; print(ipaddress.ip_interface(sys.argv[1]).network)" "$subnet")
    MPI_CMD=(timeout 600 ip netns exec "$mg" env PMIX_MCA_ptl_tcp_remote_connections=1
             PMIX_MCA_ptl_tcp_if_include=10.79.1.0/24 mpirun.openmpi --allow-run-as-root --oversubscribe
             --mca btl tcp,self --mca btl_tcp_if_include "$subnet")
    for k in $(seq 0 $((n - 1))); do
        [ "$k" -gt 0 ] && MPI_CMD+=(:)
        MPI_CMD+=(-n 1 ip netns exec "qv-$cl-n$k" "$@")
    done
}
