#!/usr/bin/env bash
# Where a target's CPU goes per I/O: each of TARGETS (`spdk`: SPDK's nvmf_tgt on one core; `ours`:
# this tree's nvmf-target, `threads: 1`; or the path of another nvmf-target binary) runs with a
# null namespace on CPU 0 while SPDK's spdk_nvme_perf reads from it on CPU 1 (NVMe/TCP on
# 127.0.0.1), and `perf record` samples CPU 0 for RECORD seconds in the middle of the run. Prints
# per target the IOPS and the CPU time per I/O split into kernel, user space and idle
# (nanoseconds per I/O: the share of CPU 0's samples times 1 s / IOPS), then the TOP symbols by
# time per I/O. Both targets spin, so CPU 0 is busy either way: what differs is how much work
# each I/O takes and whose it is. The kernel share includes the loopback's receive path of the
# client's socket (on loopback the sender's CPU runs it). A measurement, not a test; not part of
# CI or scripts/test.sh. Needs Linux `perf` (Debian: linux-perf).
#
#   ../shared/tools/build-spdk.sh first (SPDK v23.01.1 in /tmp/spdk-src), then:
#   scripts/bench-profile.sh                          # TARGETS="spdk ours", 4k randread QD32
#   RW=read BS=128k QD=8 ROUNDS=3 scripts/bench-profile.sh
#   TARGETS="/tmp/base-build/release/nvmf-target ours" scripts/bench-profile.sh   # before/after
# RUNTIME (default 10 s) per target; perf records RECORD (5) seconds from SKIP (3) seconds in,
# after spdk_nvme_perf's start-up. SETTINGS: more `target:` settings for ours (default
# "c2h_success: always", as SPDK's target sends C2H data with SUCCESS).
NAME=bench-profile
source "$(dirname "$0")/bench-lib.sh"
TARGETS=${TARGETS:-spdk ours}
RW=${RW:-randread} BS=${BS:-4k} QD=${QD:-32}
RUNTIME=${RUNTIME:-10}
RECORD=${RECORD:-5}
SKIP=${SKIP:-3}
ROUNDS=${ROUNDS:-1}
TOP=${TOP:-15}
SETTINGS=${SETTINGS-c2h_success: always}
NQN=nqn.2026-11.io.nvmf-rs:bench-profile
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b1c2a52-2f4e-4f0e-9d1e-5e0f3c2a7b10
TGT_CPU=0 CLIENT_CPU=1
command -v perf >/dev/null || { echo "$NAME: needs perf (Debian: apt-get install linux-perf)" >&2; exit 2; }
[ $((SKIP + RECORD)) -lt "$RUNTIME" ] || { echo "$NAME: SKIP + RECORD must be less than RUNTIME" >&2; exit 2; }
source "$(dirname "$0")/spdk-lib.sh"
# shellcheck disable=SC2086 # TARGETS is a list
check_targets $TARGETS

# Symbols the kernel runs while the CPU has nothing to do.
IDLE_RE='pv_native_safe_halt|default_idle|native_safe_halt|intel_idle|acpi_idle|poll_idle|cpuidle|mwait_idle|do_idle'

# profile TARGET: one run; prints its report.
profile() {
    local t=$1 data=$dir/perf.data
    start "$t"
    (sleep "$SKIP" && perf record -q -C "$TGT_CPU" -o "$data" -- sleep "$RECORD" >/dev/null 2>&1) &
    local rec=$!
    spdk_perf "$RW" "$BS" "$QD"
    wait "$rec" || { echo "$NAME: perf record failed" >&2; exit 1; }
    stop "$t"
    # "<percent>% <dso> <[k] or [.]> <symbol>" per symbol, every sample.
    perf report -i "$data" --no-children --sort dso,sym -q -g none --percent-limit 0 2>/dev/null |
        awk -v iops="$IOPS" -v top="$TOP" -v idle="$IDLE_RE" -v name="$t" '
        /%/ {
            p = $1; sub(/%/, "", p)
            kind = ($3 == "[k]") ? "kernel" : "user"
            sym = $4; for (i = 5; i <= NF; i++) sym = sym " " $i
            if (kind == "kernel" && sym ~ idle) kind = "idle"
            share[kind] += p
            n++; pct[n] = p; what[n] = kind; name_[n] = sym; dso[n] = $2
        }
        END {
            ns = 1e9 / iops / 100
            printf "%-12s %8d IOPS  per I/O: kernel %5.0f ns  user %5.0f ns  idle %5.0f ns  (kernel %.1f%% user %.1f%% idle %.1f%% of CPU %s)\n",
                name, iops, share["kernel"] * ns, share["user"] * ns, share["idle"] * ns,
                share["kernel"], share["user"], share["idle"], '"$TGT_CPU"'
            for (i = 1; i <= n && i <= top; i++)
                printf "    %6.0f ns  %5.2f%%  %-6s %s (%s)\n", pct[i] * ns, pct[i], what[i], name_[i], dso[i]
        }'
}

echo "$NAME: CPU $TGT_CPU per I/O, spdk_nvme_perf $RW $BS QD$QD on CPU $CLIENT_CPU, ${RECORD}s sampled of ${RUNTIME}s; targets: $TARGETS; $(tcp_settings)"
for r in $(seq "$ROUNDS"); do
    [ "$ROUNDS" = 1 ] || echo "round $r"
    # shellcheck disable=SC2086 # TARGETS is a list of words
    for t in $(in_turn "$r" $TARGETS); do
        rm -f /dev/hugepages/"$NAME"* 2>/dev/null || true
        profile "$t"
    done
done
