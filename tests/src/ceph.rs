//! The single-node test cluster (`scripts/ceph-cluster.sh`): `NVMF_CEPH_CONF` names its
//! ceph.conf (`scripts/test.sh` starts it and sets it). Images made here are removed on drop.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The test cluster's configuration file, or `None` (after saying so) when no cluster is set
/// up: the RBD tests then have nothing to run against.
pub fn conf() -> Option<PathBuf> {
    match std::env::var_os("NVMF_CEPH_CONF") {
        Some(c) => Some(PathBuf::from(c)),
        None => {
            eprintln!(
                "NVMF_CEPH_CONF is not set (scripts/ceph-cluster.sh start prints it): no Ceph \
                 cluster, RBD test not run"
            );
            None
        }
    }
}

/// Runs the `rbd` tool against the cluster; panics with its output if it fails.
pub fn rbd(conf: &PathBuf, args: &[&str]) -> Output {
    let out = Command::new("rbd")
        .arg("-c")
        .arg(conf)
        .args(args)
        .output()
        .expect("the rbd tool (ceph-common)");
    assert!(
        out.status.success(),
        "rbd {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// An image in pool `rbd`, created for a test and removed on drop.
pub struct TestImage {
    pub conf: PathBuf,
    pub name: String,
}

impl TestImage {
    pub fn create(conf: &PathBuf, tag: &str, mib: u64) -> TestImage {
        Self::create_with(conf, tag, mib, &[])
    }

    /// As [`TestImage::create`], with more `rbd create` arguments (e.g. `--image-feature`).
    pub fn create_with(conf: &PathBuf, tag: &str, mib: u64, extra: &[&str]) -> TestImage {
        let name = format!("{tag}-{}-{:08x}", std::process::id(), rand::random::<u32>());
        let (size, spec) = (mib.to_string(), format!("rbd/{name}"));
        let mut args = vec!["create", "--size", &size, &spec];
        args.extend_from_slice(extra);
        rbd(conf, &args);
        TestImage {
            conf: conf.clone(),
            name,
        }
    }

    /// `rbd/<name>`.
    pub fn spec(&self) -> String {
        format!("rbd/{}", self.name)
    }

    pub fn resize(&self, mib: u64) {
        rbd(
            &self.conf,
            &["resize", "--size", &mib.to_string(), &self.spec()],
        );
    }

    /// A namespace entry serving this image.
    pub fn namespace_yaml(&self, nsid: u32) -> String {
        format!(
            "{{ nsid: {nsid}, rbd: {{ pool: rbd, image: {}, conf: {} }} }}",
            self.name,
            self.conf.display()
        )
    }
}

impl Drop for TestImage {
    /// Removes the image without waiting: a target that was killed leaves its watch on the
    /// image until the OSD times it out (30 s), and `rbd rm` waits for that.
    fn drop(&mut self) {
        let _ = Command::new("rbd")
            .arg("-c")
            .arg(&self.conf)
            .args(["rm", "--no-progress", &self.spec()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }
}

/// A target configuration on `port` with subsystem `TEST_NQN` serving `namespaces` (YAML flow
/// maps, one per namespace).
pub fn target_yaml(port: u16, namespaces: &[String]) -> String {
    let mut s = format!(
        "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
         subsystems:\n  - nqn: {}\n    allow_any_host: true\n    namespaces:\n",
        crate::TEST_NQN
    );
    for n in namespaces {
        s += &format!("      - {n}\n");
    }
    s + "target: { threads: 2, keep_alive_ms_min: 1000 }\n"
}

/// NVMe/TCP to `t` on 127.0.0.1 for `TEST_NQN`, with a 10 s command timeout (a gateway test's
/// path).
pub fn tcp_path(t: &crate::TargetProc) -> initiator::ConnectOptions {
    let mut o = initiator::ConnectOptions::tcp("127.0.0.1", t.addr.port(), crate::TEST_NQN);
    o.timeout = std::time::Duration::from_secs(10);
    o
}

/// 8 KiB block `i` of the gateway tests' verified writes.
pub fn pattern(i: u64) -> Vec<u8> {
    (0..8192u64)
        .map(|k| (k.wrapping_mul(37) ^ i.wrapping_mul(151)) as u8)
        .collect()
}
