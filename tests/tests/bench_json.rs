//! `nvmf-bench` against a running `nvmf-target`: the JSON report of a 4k random read run at
//! depth 32 parses, carries the documented schema, and its numbers are consistent.
//!
//! Needs `nvmf-bench` and `nvmf-target` built in the same profile (`cargo build --workspace`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvmf_tests::{TargetProc, TEST_NQN};

/// `nvmf-bench` next to the test executable (build/<profile>/deps/<test>).
fn bench_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in build/<profile>/deps")
        .join("nvmf-bench");
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build -p nvmf-initiator; scripts/test.sh does)",
        bin.display()
    );
    bin
}

fn bench(t: &TargetProc, args: &[&str]) -> Output {
    let port = t.addr.port().to_string();
    Command::new(bench_bin())
        .args([
            "--traddr=127.0.0.1",
            "--subnqn",
            TEST_NQN,
            "--trsvcid",
            &port,
        ])
        .args(args)
        .output()
        .expect("run nvmf-bench")
}

/// A JSON value (the tests crate has no JSON dependency; this reads what serde_json writes).
#[derive(Debug, Clone, PartialEq)]
enum J {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn get(&self, k: &str) -> &J {
        match self {
            J::Obj(m) => m
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v)
                .unwrap_or_else(|| panic!("no key {k:?} in {self:?}")),
            _ => panic!("{k:?} of a non-object {self:?}"),
        }
    }
    fn at(&self, i: usize) -> &J {
        match self {
            J::Arr(v) => &v[i],
            _ => panic!("[{i}] of a non-array {self:?}"),
        }
    }
    fn len(&self) -> usize {
        match self {
            J::Arr(v) => v.len(),
            _ => panic!("len of a non-array {self:?}"),
        }
    }
    fn num(&self) -> f64 {
        match self {
            J::Num(n) => *n,
            _ => panic!("not a number: {self:?}"),
        }
    }
    fn str(&self) -> &str {
        match self {
            J::Str(s) => s,
            _ => panic!("not a string: {self:?}"),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at byte {}", c as char, self.i))
        }
    }
    fn lit(&mut self, word: &str, v: J) -> Result<J, String> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(format!("bad literal at byte {}", self.i))
        }
    }
    fn string(&mut self) -> Result<String, String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        loop {
            let c = *self.s.get(self.i).ok_or("unterminated string")?;
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                b'\\' => {
                    let e = *self.s.get(self.i).ok_or("bad escape")?;
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hex = std::str::from_utf8(&self.s[self.i..self.i + 4])
                                .map_err(|e| e.to_string())?;
                            self.i += 4;
                            let mut cp = u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                            if (0xd800..0xdc00).contains(&cp) {
                                // A surrogate pair: \uD8xx\uDCxx.
                                let lo = std::str::from_utf8(&self.s[self.i + 2..self.i + 6])
                                    .map_err(|e| e.to_string())?;
                                self.i += 6;
                                let lo = u32::from_str_radix(lo, 16).map_err(|e| e.to_string())?;
                                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                            }
                            char::from_u32(cp).ok_or("bad code point")?
                        }
                        _ => return Err(format!("bad escape at byte {}", self.i)),
                    };
                    let mut b = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                }
                c => out.push(c),
            }
        }
    }
    fn value(&mut self) -> Result<J, String> {
        self.ws();
        match *self.s.get(self.i).ok_or("unexpected end")? {
            b'n' => self.lit("null", J::Null),
            b't' => self.lit("true", J::Bool(true)),
            b'f' => self.lit("false", J::Bool(false)),
            b'"' => Ok(J::Str(self.string()?)),
            b'[' => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(J::Arr(v));
                }
                loop {
                    v.push(self.value()?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(J::Arr(v));
                        }
                        _ => return Err(format!("bad array at byte {}", self.i)),
                    }
                }
            }
            b'{' => {
                self.i += 1;
                let mut m = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(J::Obj(m));
                }
                loop {
                    let k = self.string()?;
                    self.eat(b':')?;
                    m.push((k, self.value()?));
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(J::Obj(m));
                        }
                        _ => return Err(format!("bad object at byte {}", self.i)),
                    }
                }
            }
            _ => {
                let start = self.i;
                while self.i < self.s.len() && b"+-0123456789.eE".contains(&self.s[self.i]) {
                    self.i += 1;
                }
                std::str::from_utf8(&self.s[start..self.i])
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .map(J::Num)
                    .ok_or_else(|| format!("bad value at byte {start}"))
            }
        }
    }
}

fn parse_json(text: &str) -> Result<J, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let v = p.value()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("trailing bytes at {}", p.i));
    }
    Ok(v)
}

#[test]
fn json_parser_reads_what_it_needs() {
    let v =
        parse_json(r#" {"a": [1, -2.5e3, true, null], "b": "x\"\u00e9\ud83d\ude00—", "c": {}} "#)
            .unwrap();
    assert_eq!(v.get("a").at(1).num(), -2500.0);
    assert_eq!(v.get("a").at(3), &J::Null);
    assert_eq!(v.get("b").str(), "x\"é😀—");
    assert!(parse_json("{\"a\": 1,}").is_err());
    assert!(parse_json("[1] 2").is_err());
}

fn assert_latency_ordered(l: &J) {
    let k = ["min", "p50", "p90", "p99", "p99_9", "max"].map(|k| l.get(k).num());
    assert!(k[0] > 0.0, "{l:?}");
    assert!(
        k.windows(2).all(|w| w[0] <= w[1]),
        "percentiles out of order: {l:?}"
    );
    let mean = l.get("mean").num();
    assert!(k[0] <= mean && mean <= k[5], "{l:?}");
}

#[test]
fn randread_qd32_json_report() {
    let t = TargetProc::start_default();
    let out = bench(
        &t,
        &[
            "--rw=randread",
            "--bs=4k",
            "--iodepth=32",
            "--runtime=2",
            "--output-format=json",
            "--compare",
            "tcp,rdma",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "nvmf-bench failed ({}):\n{stdout}\n{stderr}\ntarget log:\n{}",
        out.status,
        t.log_text()
    );
    let v = parse_json(&stdout).unwrap_or_else(|e| panic!("{e}:\n{stdout}"));
    assert_eq!(v.get("schema").str(), "nvmf-bench/1");
    assert_eq!(v.get("target").get("subnqn").str(), TEST_NQN);
    let w = v.get("workloads").at(0);
    assert_eq!(w.get("rw").str(), "randread");
    assert_eq!(w.get("bs").num(), 4096.0);
    assert_eq!(w.get("iodepth").num(), 32.0);
    assert_eq!(w.get("runtime_s").num(), 2.0);
    let results = w.get("results");
    assert_eq!(results.len(), 2);

    let tcp = results.at(0);
    assert_eq!(tcp.get("transport").str(), "tcp");
    assert_eq!(tcp.get("status").str(), "ok", "{tcp:?}");
    let elapsed = tcp.get("elapsed_s").num();
    assert!((1.9..2.5).contains(&elapsed), "measured window {elapsed}");
    assert_eq!(tcp.get("region_bytes").num(), (64u64 << 20) as f64);
    let total = tcp.get("total");
    let read = tcp.get("read");
    let ios = total.get("ios").num();
    assert!(ios > 0.0 && total.get("iops").num() > 0.0, "{total:?}");
    assert_eq!(
        read.get("ios").num(),
        ios,
        "a pure read run: every I/O is a read"
    );
    assert_eq!(tcp.get("write").get("ios").num(), 0.0);
    assert_eq!(tcp.get("write").get("lat_ns"), &J::Null);
    assert_eq!(total.get("bytes").num(), ios * 4096.0);
    let iops = total.get("iops").num();
    assert!(
        (iops - ios / elapsed).abs() < 1.0,
        "{iops} vs {ios}/{elapsed}"
    );
    assert!((total.get("mib_s").num() - iops * 4096.0 / 1048576.0).abs() < 0.01);
    assert_latency_ordered(total.get("lat_ns"));
    // Little's law: with 32 in flight the mean latency is about 32 / IOPS.
    let mean_s = total.get("lat_ns").get("mean").num() / 1e9;
    let little = 32.0 / iops;
    assert!(
        mean_s > little * 0.5 && mean_s < little * 1.5,
        "mean latency {mean_s}s vs 32/IOPS {little}s"
    );
    let cpu = tcp.get("cpu");
    assert!(cpu.get("usec_per_io").num() > 0.0, "{cpu:?}");
    // Over TCP every payload byte crosses the socket at least once.
    let copies = tcp.get("copies");
    assert!(copies.get("socket_per_byte").num() >= 0.999, "{copies:?}");
    assert!(copies.get("per_byte").num() >= copies.get("socket_per_byte").num());
    // The queue makes system calls (sends, receives, waits), but batches them at depth 32.
    let sys = tcp.get("syscalls_per_io").num();
    assert!(sys > 0.0 && sys < 8.0, "syscalls per I/O {sys}");
    assert_eq!(tcp.get("verify"), &J::Null);

    // This target listens on TCP only: RDMA never produces numbers here; it says why.
    let rdma = results.at(1);
    assert_eq!(rdma.get("transport").str(), "rdma");
    let status = rdma.get("status").str();
    assert!(status == "skipped" || status == "failed", "{rdma:?}");
    assert!(!rdma.get("reason").str().is_empty());
    assert_eq!(rdma.get("total"), &J::Null);
    let no_device = std::fs::read_dir("/sys/class/infiniband").map_or(true, |d| d.count() == 0);
    if no_device {
        assert_eq!(status, "skipped");
        assert!(
            rdma.get("reason").str().contains("no RDMA device"),
            "{rdma:?}"
        );
    }
}

#[test]
fn text_report_table_baseline_and_plot() {
    let t = TargetProc::start_default();
    let plot = t.dir.0.join("cdf.svg");
    let plot_arg = format!("--latency-plot={}", plot.display());
    let out = bench(
        &t,
        &[
            "--rw=randrw",
            "--rwmixread=70",
            "--bs=8k",
            "--iodepth=4",
            "--numjobs=2",
            "--runtime=1",
            "--ramp_time=0.2",
            "--raw-tcp-baseline",
            &plot_arg,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}:\n{stdout}\n{stderr}", out.status);
    for want in [
        "8k randrw qd4 70%r x2 [tcp]",
        "  read: IOPS=",
        "  write: IOPS=",
        "lat percentiles: p50=",
        "cpu: usr=",
        "copies: ",
        "raw-tcp stream: 2 connection(s)",
        "raw-tcp ping-pong: 2 connection(s) x depth 4, 72-byte request, 8192-byte reply",
        "workload",
        "p99.9",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
    let svg = std::fs::read_to_string(&plot).expect("plot written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(
        svg.matches("<path").count(),
        2,
        "tcp and raw-tcp curves:\n{svg}"
    );
    assert!(svg.contains("log scale"));
}

#[test]
fn bad_options_are_usage_errors() {
    let t = TargetProc::start_default();
    for (args, want) in [
        (&["--bs=3000"][..], "multiple"),
        (&["--size=65m"][..], "beyond the namespace"),
        (&["--iodepth=4096"][..], "queue depth"),
        (&["--nsid=7"][..], "namespace 7 is not active"),
    ] {
        let out = bench(&t, &[&["--runtime=1"][..], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(want),
            "{args:?}: expected {want:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = bench(&t, &["--time_based"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--runtime"));
}
