#!/usr/bin/env bash
# kernel-host-reload-tcp: SIGHUP reload of our target under the Linux host over tcp: an added
# namespace appears on the host (AEN) and passes fio verify, a removed one disappears, a broken
# config is rejected with file:line while namespace 1 keeps serving.
# vm-needs: build
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
kernel_host_reload "$SCENARIO" tcp 127.0.0.1
