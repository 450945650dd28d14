//! Bad configurations: each must be rejected with exactly one error, at an exact line and
//! column, naming the key path, with a recognisable message.

mod common;

use common::{errors, warnings, TempDir};

const L: &str = "listeners:\n  - { transport: tcp, address: 127.0.0.1 }\n";

/// `L` plus one subsystem (lines 3-6) whose namespace list starts at line 7.
fn ns(lines: &str) -> String {
    format!(
        "{L}subsystems:\n  - nqn: nqn.2026-11.io.example:a\n    allow_any_host: true\n    \
         namespaces:\n{lines}"
    )
}

/// `L` plus one subsystem whose keys (after nqn at line 4) start at line 5.
fn subsys(lines: &str) -> String {
    format!("{L}subsystems:\n  - nqn: nqn.2026-11.io.example:a\n{lines}")
}

struct Case {
    text: String,
    /// `t.yaml:LINE:COLUMN: PATH:`
    at: &'static str,
    fragment: &'static str,
}

fn case(text: impl Into<String>, at: &'static str, fragment: &'static str) -> Case {
    Case {
        text: text.into(),
        at,
        fragment,
    }
}

fn check(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for c in &cases {
        let errs = errors(&c.text);
        let good = errs.len() == 1
            && errs[0].starts_with(&format!("{} ", c.at))
            && errs[0].contains(c.fragment);
        if !good {
            failures.push(format!(
                "expected one error `{} ...{}...`, got {errs:#?}\n--- text:\n{}",
                c.at, c.fragment, c.text
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

#[test]
fn structure_and_types() {
    let big_nqn = format!("nqn.2026-11.io.example:{}", "x".repeat(201));
    check(vec![
        case(
            "hello\n",
            "t.yaml:1:1:",
            "expected a mapping, found the value `hello`",
        ),
        case("listeners: [\n", "t.yaml:2:1:", "YAML syntax error"),
        case(
            "listeners:\n  - { transport: tcp, transport: tcp, address: 127.0.0.1 }\n",
            "t.yaml:2:23:",
            "duplicate key `transport` (first given at line 2)",
        ),
        case(
            format!("{L}listener: []\n"),
            "t.yaml:3:1: listener:",
            "did you mean `listeners`?",
        ),
        case(
            format!("{L}colour: blue\n"),
            "t.yaml:3:1: colour:",
            "unknown key `colour`; expected one of: listeners, subsystems, target, metrics",
        ),
        case(
            "subsystems: []\n",
            "t.yaml:1:1: listeners:",
            "missing required key `listeners`",
        ),
        case(
            "listeners: []\n",
            "t.yaml:1:12: listeners:",
            "at least one listener is required",
        ),
        case(
            "listeners: {a: 1}\n",
            "t.yaml:1:12: listeners:",
            "expected a list, found a mapping",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: 127.0.0.1, prot: 4420 }\n",
            "t.yaml:2:43: listeners[0].prot:",
            "unknown key `prot`; did you mean `port`?",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: 127.0.0.1, port: x }\n",
            "t.yaml:2:49: listeners[0].port:",
            "expected an integer, found the value `x`",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: 127.0.0.1, port: '4420' }\n",
            "t.yaml:2:49: listeners[0].port:",
            "expected an integer, found the quoted value `4420`",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: 127.0.0.1, port: 70000 }\n",
            "t.yaml:2:49: listeners[0].port:",
            "70000 is too large (at most 65535)",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: 127.0.0.1, port: -1 }\n",
            "t.yaml:2:49: listeners[0].port:",
            "must not be negative",
        ),
        case(
            "listeners:\n  - { transport: tcp }\n",
            "t.yaml:2:5: listeners[0].address:",
            "missing required key `address`",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: [1] }\n",
            "t.yaml:2:32: listeners[0].address:",
            "expected a string, found a list",
        ),
        case(
            format!("{L}subsystems:\n  - foo\n"),
            "t.yaml:4:5: subsystems[0]:",
            "expected a mapping, found the value `foo`",
        ),
        case(
            subsys("    hosts: nqn.2026-11.io.example:h\n"),
            "t.yaml:5:12: subsystems[0].hosts:",
            "expected a list",
        ),
        case(
            subsys("    allow_any_host: yes\n"),
            "t.yaml:5:21: subsystems[0].allow_any_host:",
            "expected true or false, found the value `yes` (YAML 1.2 has only true and false)",
        ),
        case(
            subsys("    allow_any_hosts: true\n"),
            "t.yaml:5:5: subsystems[0].allow_any_hosts:",
            "did you mean `allow_any_host`?",
        ),
        case(
            ns("      - { nsid: one, null: 1GiB }\n"),
            "t.yaml:7:17: subsystems[0].namespaces[0].nsid:",
            "expected an integer",
        ),
        case(
            ns("      - { null: 1GiB }\n"),
            "t.yaml:7:9: subsystems[0].namespaces[0].nsid:",
            "missing required key `nsid`",
        ),
        case(
            ns("      - { nsid: 4294967296, null: 1GiB }\n"),
            "t.yaml:7:17: subsystems[0].namespaces[0].nsid:",
            "too large (at most 4294967295)",
        ),
        case(
            ns("      - { nsid: 1, null: 1GiB, blocksize: 512 }\n"),
            "t.yaml:7:32: subsystems[0].namespaces[0].blocksize:",
            "did you mean `block_size`?",
        ),
        case(
            ns("      - { nsid: 1, null: 4GiBs }\n"),
            "t.yaml:7:26: subsystems[0].namespaces[0].null:",
            "unknown size unit `GiBs`",
        ),
        case(
            ns("      - { nsid: 1, null: 1.5GiB }\n"),
            "t.yaml:7:26: subsystems[0].namespaces[0].null:",
            "fractional",
        ),
        case(
            ns("      - { nsid: 1, null: [] }\n"),
            "t.yaml:7:26: subsystems[0].namespaces[0].null:",
            "expected a size",
        ),
        case(
            ns("      - { nsid: 1, null: 1GiB, read_only: 1 }\n"),
            "t.yaml:7:43: subsystems[0].namespaces[0].read_only:",
            "expected true or false",
        ),
        case(
            ns("      - { nsid: 1, null: 1GiB, uuid: nope }\n"),
            "t.yaml:7:38: subsystems[0].namespaces[0].uuid:",
            "`nope` is not a UUID",
        ),
        case(
            ns("      - { nsid: 1, null: 1GiB, uuid: 00000000-0000-0000-0000-000000000000 }\n"),
            "t.yaml:7:38: subsystems[0].namespaces[0].uuid:",
            "not all zero",
        ),
        case(
            format!("{L}target: {{ thread: 2 }}\n"),
            "t.yaml:3:11: target.thread:",
            "did you mean `threads`?",
        ),
        case(
            format!("{L}target: {{ threads: two }}\n"),
            "t.yaml:3:20: target.threads:",
            "expected an integer",
        ),
        case(
            format!("{L}target: []\n"),
            "t.yaml:3:9: target:",
            "expected a mapping, found a list",
        ),
        case(
            format!("{L}metrics: {{}}\n"),
            "t.yaml:3:10: metrics.listen:",
            "missing required key `listen`",
        ),
        case(
            format!("{L}metrics: {{ listen: 9940 }}\n"),
            "t.yaml:3:20: metrics.listen:",
            "`9940` is not ADDRESS:PORT",
        ),
        case(
            format!("{L}subsystems:\n  - nqn: {big_nqn}\n    allow_any_host: true\n"),
            "t.yaml:4:10: subsystems[0].nqn:",
            "224 bytes long; the limit is 223",
        ),
    ]);
}

#[test]
fn semantic_rules() {
    check(vec![
        // Listeners.
        case(
            "listeners:\n  - { transport: udp, address: 127.0.0.1 }\n",
            "t.yaml:2:18: listeners[0].transport:",
            "unknown transport `udp` (expected tcp or rdma)",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: localhost }\n",
            "t.yaml:2:32: listeners[0].address:",
            "`localhost` is not an IP address",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: 255.255.255.255 }\n",
            "t.yaml:2:32: listeners[0].address:",
            "not a unicast address",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: 127.0.0.1, port: 0 }\n",
            "t.yaml:2:49: listeners[0].port:",
            "port 0 is not allowed",
        ),
        case(
            format!("{L}  - {{ transport: tcp, address: 127.0.0.1 }}\n"),
            "t.yaml:3:5: listeners[1].port:",
            "tcp 127.0.0.1:4420 has the same transport, address and port as listeners[0] (line 2)",
        ),
        case(
            format!("{L}  - {{ transport: tcp, address: 0.0.0.0, port: 4420 }}\n"),
            "t.yaml:3:47: listeners[1].port:",
            "an overlapping address (0.0.0.0 covers 127.0.0.1)",
        ),
        // Subsystems.
        case(
            format!(
                "{L}subsystems:\n  - {{ nqn: nqn.2026-11.io.example:a, allow_any_host: true }}\n  \
                 - {{ nqn: nqn.2026-11.io.example:a, allow_any_host: true }}\n"
            ),
            "t.yaml:5:12: subsystems[1].nqn:",
            "duplicate subsystem NQN `nqn.2026-11.io.example:a` (first used at line 4)",
        ),
        // A subsystem name that is no NQN is served with a warning (nvmet takes any name);
        // hosts must be NQNs.
        case(
            subsys("    hosts: [ nqn.2026-13.io.example:h ]\n"),
            "t.yaml:5:14: subsystems[0].hosts[0]:",
            "date `yyyy-mm.`",
        ),
        case(
            subsys("    hosts: [ nqn.2026-11.io.example ]\n"),
            "t.yaml:5:14: subsystems[0].hosts[0]:",
            "no `:` found",
        ),
        case(
            format!("{L}subsystems:\n  - {{ nqn: \"a\\tb\", allow_any_host: true }}\n"),
            "t.yaml:4:12: subsystems[0].nqn:",
            "control character",
        ),
        case(
            format!("{L}subsystems:\n  - {{ nqn: nqn.2014-08.org.nvmexpress.discovery, allow_any_host: true }}\n"),
            "t.yaml:4:12: subsystems[0].nqn:",
            "discovery subsystem's NQN",
        ),
        case(
            subsys("    hosts: [ nqn.bad ]\n"),
            "t.yaml:5:14: subsystems[0].hosts[0]:",
            "date",
        ),
        case(
            subsys("    hosts: [ nqn.2014-08.org.nvmexpress.discovery ]\n"),
            "t.yaml:5:14: subsystems[0].hosts[0]:",
            "the discovery NQN cannot be a host NQN",
        ),
        case(
            subsys("    hosts: [ 'nqn.2014-08.org.nvmexpress:uuid:not-a-uuid' ]\n"),
            "t.yaml:5:14: subsystems[0].hosts[0]:",
            "is not a UUID",
        ),
        case(
            subsys("    allow_any_host: true\n    serial: ABCDEFGHIJKLMNOPQRSTU\n"),
            "t.yaml:6:13: subsystems[0].serial:",
            "serial `ABCDEFGHIJKLMNOPQRSTU` is 21 characters; at most 20 fit",
        ),
        case(
            subsys("    allow_any_host: true\n    serial: \"séria\"\n"),
            "t.yaml:6:13: subsystems[0].serial:",
            "serial must be printable ASCII; 'é' is not",
        ),
        case(
            subsys("    allow_any_host: true\n    serial: ' X'\n"),
            "t.yaml:6:13: subsystems[0].serial:",
            "must not start or end with a space",
        ),
        case(
            subsys("    allow_any_host: true\n    model: 'a model name that is longer than forty bytes'\n"),
            "t.yaml:6:12: subsystems[0].model:",
            "at most 40 fit",
        ),
        // Namespaces.
        case(ns("      - { nsid: 0, null: 1GiB }\n"), "t.yaml:7:17: subsystems[0].namespaces[0].nsid:", "nsid 0 is reserved"),
        case(ns("      - { nsid: 0xffffffff, null: 1GiB }\n"), "t.yaml:7:17: subsystems[0].namespaces[0].nsid:", "nsid 0xffffffff is reserved"),
        case(
            ns("      - { nsid: 1, null: 1GiB }\n      - { nsid: 1, null: 2GiB }\n"),
            "t.yaml:8:17: subsystems[0].namespaces[1].nsid:",
            "duplicate nsid 1 (first used at line 7)",
        ),
        case(
            ns("      - { nsid: 1, null: 1GiB, path: /tmp/x }\n"),
            "t.yaml:7:20: subsystems[0].namespaces[0].null:",
            "give one of `path`, `null` and `rbd`, not `path` and `null`",
        ),
        case(
            ns("      - { nsid: 1, path: /tmp/x, rbd: { pool: rbd, image: a, conf: /etc/passwd } }\n"),
            "t.yaml:7:34: subsystems[0].namespaces[0].rbd:",
            "not `path` and `rbd`",
        ),
        case(
            ns("      - { nsid: 1, rbd: { pool: rbd, conf: /etc/passwd } }\n"),
            "t.yaml:7:25: subsystems[0].namespaces[0].rbd.image:",
            "missing required key `image`",
        ),
        case(
            ns("      - { nsid: 1, rbd: { pool: 'a/b', image: c, conf: /etc/passwd } }\n"),
            "t.yaml:7:33: subsystems[0].namespaces[0].rbd.pool:",
            "not a valid pool name",
        ),
        case(
            ns("      - { nsid: 1, rbd: { pool: rbd, image: c, conf: /etc/passwd, cache: yes } }\n"),
            "t.yaml:7:67: subsystems[0].namespaces[0].rbd.cache:",
            "unknown key",
        ),
        case(
            ns("      - { nsid: 1, rbd: { pool: rbd, image: c, conf: /nonexistent/ceph.conf } }\n"),
            "t.yaml:7:54: subsystems[0].namespaces[0].rbd.conf:",
            "no such Ceph configuration file",
        ),
        case(
            format!("{L}gateway: {{ group: g1, pool: rbd, conf: /etc/passwd, lease_secs: 2 }}\n"),
            "t.yaml:3:65: gateway.lease_secs:",
            "lease_secs 2 is out of range (3 to 60)",
        ),
        case(
            format!("{L}gateway: {{ group: 'a b', pool: rbd, conf: /etc/passwd }}\n"),
            "t.yaml:3:19: gateway.group:",
            "is not a valid group",
        ),
        case(
            format!("{L}gateway: {{ group: g1, conf: /etc/passwd }}\n"),
            "t.yaml:3:10: gateway.pool:",
            "missing required key `pool`",
        ),
        case(
            format!("{L}gateway: {{ group: g1, pool: rbd, conf: /etc/passwd, ana_groups: [ 1, 0 ] }}\n"),
            "t.yaml:3:70: gateway.ana_groups[1]:",
            "ANA group 0 is out of range",
        ),
        case(
            format!("{L}gateway: {{ group: g1, pool: rbd, conf: /etc/passwd, leases: 3 }}\n"),
            "t.yaml:3:53: gateway.leases:",
            "unknown",
        ),
        case(
            format!("{L}gateway: {{ group: g1, pool: rbd, conf: /nonexistent/ceph.conf }}\n"),
            "t.yaml:3:40: gateway.conf:",
            "no such Ceph configuration file",
        ),
        case(
            "listeners:\n  - { transport: tcp, address: 127.0.0.1, ana: { 1: optimized } }\ngateway: { group: g1, pool: rbd, conf: /etc/passwd }\n",
            "t.yaml:2:48: listeners[0].ana:",
            "a gateway's ANA states come from the group's leases",
        ),
        case(
            ns("      - { nsid: 1, rbd: { pool: rbd, image: c, conf: /etc/passwd }, size: 1GiB }\n"),
            "t.yaml:7:69: subsystems[0].namespaces[0].size:",
            "an RBD namespace has its image's size",
        ),
        case(ns("      - { nsid: 1 }\n"), "t.yaml:7:9: subsystems[0].namespaces[0]:", "needs `path: FILE`"),
        case(
            ns("      - { nsid: 1, null: 1GiB, size: 1GiB }\n"),
            "t.yaml:7:32: subsystems[0].namespaces[0].size:",
            "`size` is for `path` namespaces",
        ),
        case(
            ns("      - { nsid: 1, null: 1000 }\n"),
            "t.yaml:7:26: subsystems[0].namespaces[0].null:",
            "1000 bytes is not a multiple of the block size (4096)",
        ),
        case(
            ns("      - { nsid: 1, null: 1000, block_size: 512 }\n"),
            "t.yaml:7:26: subsystems[0].namespaces[0].null:",
            "not a multiple of the block size (512)",
        ),
        case(ns("      - { nsid: 1, null: 0 }\n"), "t.yaml:7:26: subsystems[0].namespaces[0].null:", "must not be 0"),
        case(
            ns("      - { nsid: 1, null: 1GiB, block_size: 1024 }\n"),
            "t.yaml:7:44: subsystems[0].namespaces[0].block_size:",
            "block_size 1024 is not supported (use 512 or 4096)",
        ),
        case(
            ns(
                "      - { nsid: 1, null: 1GiB, uuid: 0c7b7e4a-1f2e-4c3d-9a8b-7c6d5e4f3a2b }\n      \
                 - { nsid: 2, null: 1GiB, uuid: 0c7b7e4a-1f2e-4c3d-9a8b-7c6d5e4f3a2b }\n",
            ),
            "t.yaml:8:38: subsystems[0].namespaces[1].uuid:",
            "duplicate namespace UUID 0c7b7e4a-1f2e-4c3d-9a8b-7c6d5e4f3a2b (first used at line 7)",
        ),
        // Target settings.
        case(format!("{L}target: {{ threads: 0 }}\n"), "t.yaml:3:20: target.threads:", "threads 0 is out of range (1 to 1024)"),
        case(format!("{L}target: {{ max_queue_depth: 1 }}\n"), "t.yaml:3:28: target.max_queue_depth:", "out of range (2 to 1024)"),
        case(format!("{L}target: {{ max_queue_depth: 2048 }}\n"), "t.yaml:3:28: target.max_queue_depth:", "out of range (2 to 1024)"),
        case(format!("{L}target: {{ in_capsule_data: 100 }}\n"), "t.yaml:3:28: target.in_capsule_data:", "100 bytes is not a multiple of 16"),
        case(format!("{L}target: {{ in_capsule_data: 256KiB }}\n"), "t.yaml:3:28: target.in_capsule_data:", "256KiB is larger than 128KiB"),
        case(format!("{L}target: {{ max_io_size: 2KiB }}\n"), "t.yaml:3:24: target.max_io_size:", "2KiB is out of range (4KiB to 32MiB)"),
        case(format!("{L}target: {{ max_io_size: 64MiB }}\n"), "t.yaml:3:24: target.max_io_size:", "out of range"),
        case(format!("{L}target: {{ io_unit_size: 8MiB }}\n"), "t.yaml:3:25: target.io_unit_size:", "out of range"),
        case(format!("{L}target: {{ io_unit_size: 6000 }}\n"), "t.yaml:3:25: target.io_unit_size:", "6000 bytes is not"),
        case(
            format!("{L}target: {{ in_capsule_data: 64KiB, io_unit_size: 32KiB }}\n"),
            "t.yaml:3:28: target.in_capsule_data:",
            "larger than io_unit_size (32KiB)",
        ),
        case(format!("{L}target: {{ max_io_size: 6000 }}\n"), "t.yaml:3:24: target.max_io_size:", "6000 bytes is not a multiple of 4KiB"),
        case(
            format!("{L}target: {{ in_capsule_data: 64KiB, max_io_size: 32KiB }}\n"),
            "t.yaml:3:28: target.in_capsule_data:",
            "in_capsule_data (64KiB) is larger than max_io_size (32KiB)",
        ),
        case(format!("{L}target: {{ keep_alive_ms_min: 0 }}\n"), "t.yaml:3:30: target.keep_alive_ms_min:", "out of range (100 to 3600000)"),
        case(format!("{L}target: {{ idle_poll_us: 2000000 }}\n"), "t.yaml:3:25: target.idle_poll_us:", "out of range (0 to 1000000)"),
        case(format!("{L}target: {{ rdma_srq_depth: 16 }}\n"), "t.yaml:3:27: target.rdma_srq_depth:", "rdma_srq_depth 16 is out of range (0 for a receive queue per queue pair, or 32 to 65536 RECV buffers per shared receive queue)"),
        case(format!("{L}target: {{ rdma_srq_depth: 65537 }}\n"), "t.yaml:3:27: target.rdma_srq_depth:", "out of range (0 for a receive queue per queue pair, or 32 to 65536"),
        case(format!("{L}target: {{ polling: spin }}\n"), "t.yaml:3:20: target.polling:", "unknown polling mode `spin` (expected adaptive, busy or interrupt)"),
        case(format!("{L}target: {{ c2h_success: never }}\n"), "t.yaml:3:24: target.c2h_success:", "unknown c2h_success mode `never` (expected spec or always)"),
        case(format!("{L}target: {{ tcp_receive: poll }}\n"), "t.yaml:3:24: target.tcp_receive:", "unknown tcp_receive mode `poll` (expected auto, io_uring or epoll)"),
        case(format!("{L}target: {{ tcp_send: send }}\n"), "t.yaml:3:21: target.tcp_send:", "unknown tcp_send mode `send` (expected auto, io_uring or sendmsg)"),
        // Metrics.
        case(format!("{L}metrics: {{ listen: '127.0.0.1:0' }}\n"), "t.yaml:3:20: metrics.listen:", "port 0 is not allowed"),
        case(
            format!("{L}metrics: {{ listen: '0.0.0.0:4420' }}\n"),
            "t.yaml:3:20: metrics.listen:",
            "clashes with the TCP listener listeners[0] (127.0.0.1:4420, line 2)",
        ),
    ]);
}

#[test]
fn filesystem_rules() {
    let dir = TempDir::new("fs");
    let d = dir.str();
    dir.file("odd.img", 4096 + 512);
    dir.file("empty.img", 0);
    dir.file("small.img", 8192);
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let size_col = |line: &str| line.find("size:").unwrap() + 7;
    let missing_odd = format!("      - {{ nsid: 1, path: {d}/new.img, size: 1000 }}\n");
    let text = ns(&missing_odd);
    let errs = errors(&text);
    assert_eq!(
        errs,
        [format!(
            "t.yaml:7:{}: subsystems[0].namespaces[0].size: 1000 bytes is not a multiple of the \
             block size (4096)",
            size_col(&missing_odd)
        )]
    );
    check(vec![
        case(
            ns(&format!("      - {{ nsid: 1, path: {d}/missing.img }}\n")),
            "t.yaml:7:26: subsystems[0].namespaces[0].path:",
            "missing.img` does not exist; give `size` to have it created",
        ),
        case(
            ns(&format!(
                "      - {{ nsid: 1, path: {d}/no/such/dir/x.img, size: 1GiB }}\n"
            )),
            "t.yaml:7:26: subsystems[0].namespaces[0].path:",
            "cannot be created: directory",
        ),
        case(
            ns(&format!("      - {{ nsid: 1, path: {d}/sub }}\n")),
            "t.yaml:7:26: subsystems[0].namespaces[0].path:",
            "sub` is a directory",
        ),
        case(
            ns(&format!("      - {{ nsid: 1, path: {d}/odd.img }}\n")),
            "t.yaml:7:26: subsystems[0].namespaces[0].path:",
            "odd.img` is 4608 bytes, not a multiple of the block size (4096)",
        ),
        case(
            ns(&format!("      - {{ nsid: 1, path: {d}/empty.img }}\n")),
            "t.yaml:7:26: subsystems[0].namespaces[0].path:",
            "empty.img` is an empty file",
        ),
        case(
            ns("      - { nsid: 1, path: /dev/null }\n"),
            "t.yaml:7:26: subsystems[0].namespaces[0].path:",
            "is neither a regular file nor a block device",
        ),
        case(
            ns("      - { nsid: 1, path: '' }\n"),
            "t.yaml:7:26: subsystems[0].namespaces[0].path:",
            "the path is empty",
        ),
    ]);
    // An odd file is fine with 512-byte blocks.
    let ok = common::ok(&ns(&format!(
        "      - {{ nsid: 1, path: {d}/odd.img, block_size: 512 }}\n"
    )));
    assert_eq!(ok.config.subsystems[0].namespaces[0].block_size, Some(512));
    // An existing file keeps its length; a different `size` is only a warning.
    let line = format!("      - {{ nsid: 1, path: {d}/small.img, size: 1GiB }}\n");
    let w = warnings(&ns(&line));
    assert_eq!(
        w,
        [format!(
            "t.yaml:7:{}: warning: subsystems[0].namespaces[0].size: `{d}/small.img` already \
             exists with 8192 bytes; `size` (1GiB) only applies when the file is created and is \
             ignored",
            size_col(&line)
        )]
    );
}

#[test]
fn every_error_is_reported_in_document_order() {
    let text = "\
listeners:
  - { transport: tcp, address: 127.0.0.1, port: 0, bogus: 1 }
  - { transport: quic, address: 10.0.0.1 }
subsystems:
  - nqn: \"\"
    allow_any_host: maybe
    namespaces:
      - { nsid: 0, null: 1GiB }
      - { nsid: 2, null: 1000 }
      - { nsid: 2, null: 1GiB }
target: { threads: 0, max_io_size: 1KiB }
metrics: { listen: nowhere }
";
    let errs = errors(text);
    let expected = [
        "t.yaml:2:49: listeners[0].port: port 0 is not allowed",
        "t.yaml:2:52: listeners[0].bogus: unknown key `bogus`; expected one of: transport, address, port",
        "t.yaml:3:18: listeners[1].transport: unknown transport `quic` (expected tcp or rdma)",
        "t.yaml:5:10: subsystems[0].nqn: the name is empty",
        "t.yaml:6:21: subsystems[0].allow_any_host: expected true or false, found the value `maybe`",
        "t.yaml:8:17: subsystems[0].namespaces[0].nsid: nsid 0 is reserved (valid namespace IDs are 1 to 0xfffffffe)",
        "t.yaml:9:26: subsystems[0].namespaces[1].null: 1000 bytes is not a multiple of the block size (4096)",
        "t.yaml:10:17: subsystems[0].namespaces[2].nsid: duplicate nsid 2 (first used at line 9)",
        "t.yaml:11:20: target.threads: threads 0 is out of range (1 to 1024)",
        "t.yaml:11:36: target.max_io_size: 1KiB is out of range (4KiB to 32MiB)",
        "t.yaml:12:20: metrics.listen: `nowhere` is not ADDRESS:PORT (e.g. 127.0.0.1:9940 or [::1]:9940)",
    ];
    assert_eq!(errs.len(), expected.len(), "{errs:#?}");
    for (got, want) in errs.iter().zip(expected) {
        assert!(got.starts_with(want), "got  {got}\nwant {want}");
    }
}

#[test]
fn warnings_do_not_reject() {
    let cases: &[(String, &str)] = &[
        (
            subsys("    allow_any_host: true\n    hosts: [ nqn.2026-11.io.example:h ]\n"),
            "t.yaml:6:12: warning: subsystems[0].hosts: `hosts` is ignored because `allow_any_host` is true",
        ),
        (
            subsys("    allow_any_host: false\n"),
            "t.yaml:4:5: warning: subsystems[0]: no host can connect: `allow_any_host` is false and `hosts` is empty",
        ),
        (
            subsys("    hosts: [ nqn.2026-11.io.example:h, nqn.2026-11.io.example:h ]\n"),
            "t.yaml:5:40: warning: subsystems[0].hosts[1]: host `nqn.2026-11.io.example:h` is listed twice (also hosts[0])",
        ),
        (
            L.to_owned(),
            "t.yaml:1:1: warning: subsystems: no subsystems are configured: the target serves discovery only",
        ),
        (
            format!("{L}subsystems: []\n"),
            "t.yaml:3:13: warning: subsystems: no subsystems are configured: the target serves discovery only",
        ),
        (
            format!("{L}subsystems:\n  - nqn: testnqn\n    allow_any_host: true\n"),
            "t.yaml:4:10: warning: subsystems[0].nqn: `testnqn` is not an NVMe Qualified Name (NQN must start with `nqn.`); it is served as it is, as nvmet does, and hosts must connect with exactly this name",
        ),
        (
            format!("{L}target: {{ max_io_size: 96KiB }}\n"),
            "t.yaml:3:24: warning: target.max_io_size: MDTS is a power of two of 4KiB pages: hosts will be told 64KiB, not 96KiB",
        ),
    ];
    for (text, want) in cases {
        let w = warnings(text);
        assert!(
            w.iter().any(|w| w == want),
            "want {want}\ngot {w:#?}\n--- text:\n{text}"
        );
    }
    // The subsystem-level cases above also warn "no namespaces"; a clean one warns nothing.
    assert_eq!(
        warnings(&ns("      - { nsid: 1, null: 1GiB }\n")),
        Vec::<String>::new()
    );
}

#[test]
fn hostile_input_is_rejected_without_crashing() {
    let deep = format!(
        "listeners: {}{}\n",
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    let errs = errors(&deep);
    assert_eq!(errs.len(), 1, "{errs:?}");
    // The parser's own limit (it scans ahead) or ours, whichever comes first.
    let too_deep = |e: &str| e.contains("recursion limit exceeded") || e.contains("nest deeper");
    assert!(
        errs[0].starts_with("t.yaml:1:") && too_deep(&errs[0]),
        "{errs:?}"
    );
    let deep_map = format!("{}1{}\n", "{a: ".repeat(50_000), "}".repeat(50_000));
    assert!(too_deep(&errors(&deep_map)[0]));
    let deep_block: String = (0..40)
        .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
        .collect();
    let errs = errors(&deep_block);
    assert!(
        errs[0].starts_with("t.yaml:33:65: lists and mappings nest deeper than 32"),
        "{errs:?}"
    );
    let bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n";
    let errs = errors(bomb);
    assert!(
        errs[0].starts_with("t.yaml:2:8: YAML aliases (`*name`) are not supported"),
        "{errs:?}"
    );
}
