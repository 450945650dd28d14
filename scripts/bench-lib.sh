# Shared by the scripts/bench-*.sh measurements (sourced, not run): a scratch directory, one
# nvmf-target at a time on a free loopback port, a clean exit, and reading nvmf-bench's JSON.
# The sourcing script sets NAME (for messages) and may set BIN (default build/release) and
# NO_BUILD (skip the release build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${BIN:-build/release}
[ -n "${NO_BUILD:-}" ] || cargo build --release -p nvmf-target -p nvmf-bench
command -v jq >/dev/null || { echo "$NAME: needs jq" >&2; exit 2; }

dir=$(mktemp -d)
pid=
bench_extra_cleanup() { :; }
cleanup() {
    [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
    bench_extra_cleanup
    rm -rf "$dir"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The kernel's TCP settings that shape loopback results, for the scripts' header lines: the
# congestion control (with bbr, large reads on loopback see reordering and fast retransmits
# that cubic does not: measured with 128k reads at QD8) and the default qdisc.
tcp_settings() {
    echo "tcp congestion control $(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo '?')," \
        "default qdisc $(sysctl -n net.core.default_qdisc 2>/dev/null || echo '?')"
}

# CPU ticks (user + system) of a process; hz ticks a second.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# start_target TAG NAMESPACES TARGET_SETTINGS: writes $dir/TAG.yaml (one TCP listener on a free
# port of 127.0.0.1, subsystem $NQN open to any host, NAMESPACES one YAML flow mapping a line, the
# flow mapping `target: { TARGET_SETTINGS }`), starts nvmf-target on it with the control socket
# $dir/TAG.sock and its log in $dir/TAG.log, and waits until it accepts. Sets pid and port.
start_target() {
    local tag=$1 namespaces=$2 settings=$3
    port=$(free_port)
    {
        printf 'listeners:\n  - { transport: tcp, address: 127.0.0.1, port: %s }\n' "$port"
        printf 'subsystems:\n  - nqn: %s\n    allow_any_host: true\n    namespaces:\n' "$NQN"
        printf '%s\n' "$namespaces" | sed 's/^/      - /'
        printf 'target: { %s }\n' "$settings"
    } >"$dir/$tag.yaml"
    RUST_LOG=${RUST_LOG:-info} "$BIN/nvmf-target" --config "$dir/$tag.yaml" \
        --control-socket "$dir/$tag.sock" 2>"$dir/$tag.log" &
    pid=$!
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "$NAME: nvmf-target did not listen on 127.0.0.1:$port:" >&2
    cat "$dir/$tag.log" >&2
    exit 1
}

# stop_target: SIGTERM the running target and wait for it.
stop_target() {
    kill "$pid"
    wait "$pid" || true
    pid=
}

# bench JSON ARGS...: nvmf-bench over TCP against the running target (subsystem $NQN), on CPU
# $CLIENT_CPU when that is set, JSON report in the file JSON; exits the script unless the TCP
# result's status is ok.
bench() {
    local out=$1 pin=()
    shift
    [ -z "${CLIENT_CPU:-}" ] || pin=(taskset -c "$CLIENT_CPU")
    "${pin[@]}" "$BIN/nvmf-bench" --transport tcp --traddr 127.0.0.1 --trsvcid "$port" --subnqn "$NQN" \
        --output-format json "$@" >"$out"
    local st
    st=$(jq -r "$TCP_RESULT.status" "$out")
    [ "$st" = ok ] || { echo "$NAME: nvmf-bench $*: $st" >&2; cat "$out" >&2; exit 1; }
}
# in_turn ROUND ITEM...: the items in their order in odd rounds and reversed in even ones (so
# paired runs take turns going first).
in_turn() {
    local r=$1
    shift
    if [ $((r % 2)) = 1 ]; then echo "$@"; else printf '%s\n' "$@" | tac | tr '\n' ' '; fi
}
# The jq path of the TCP result of the first workload.
TCP_RESULT='.workloads[0].results[] | select(.transport == "tcp")'

# median: the median of the numbers on stdin, one a line.
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
