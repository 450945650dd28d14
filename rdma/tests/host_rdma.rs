//! What the crate reports about the machine's RDMA, checked against the kernel's own view
//! (`/sys/class/infiniband`). On a kernel without RDMA (the build host) `devices()` must be an
//! empty list and `EventChannel::new()` must be `Error::NoRdma`; on a machine with devices
//! (the test VM) both must work and agree with sysfs. Either way the test asserts something.

use std::path::Path;

fn sysfs_devices() -> Vec<String> {
    let dir = Path::new("/sys/class/infiniband");
    let mut v: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

#[test]
fn device_list_and_event_channel_match_the_kernel() {
    let expected = sysfs_devices();
    let mut listed: Vec<String> = nvmf_rdma::devices()
        .expect("devices() must not fail")
        .into_iter()
        .map(|d| d.name)
        .collect();
    listed.sort();
    assert_eq!(
        listed, expected,
        "devices() disagrees with /sys/class/infiniband"
    );

    // Without /dev/infiniband/rdma_cm (module rdma_ucm) rdma_cm is unusable even with devices.
    let ucm = Path::new("/dev/infiniband/rdma_cm").exists();
    match nvmf_rdma::EventChannel::new() {
        Ok(ch) => {
            assert!(
                ucm && !expected.is_empty(),
                "event channel created without kernel RDMA"
            );
            assert!(ch.fd() >= 0);
            // Nothing is pending on a fresh channel.
            assert!(ch.try_get_event().unwrap().is_none());
        }
        Err(e @ nvmf_rdma::Error::NoRdma { .. }) => {
            assert!(
                expected.is_empty() || !ucm,
                "NoRdma although the kernel has devices: {e}"
            );
            let msg = e.to_string();
            assert!(msg.contains("rdma_create_event_channel"), "{msg}");
            assert!(
                msg.contains("rdma_ucm"),
                "message should say what to load: {msg}"
            );
        }
        Err(e) => panic!("EventChannel::new failed with an unexpected error: {e}"),
    }

    // rdma_cm's own device list agrees too (empty without RDMA).
    let cm = nvmf_rdma::cm_contexts().expect("cm_contexts() must not fail");
    if expected.is_empty() {
        assert!(cm.is_empty());
    } else if ucm {
        let mut names: Vec<String> = cm.iter().map(|c| c.name()).collect();
        names.sort();
        assert_eq!(names, expected);
    }
}

#[test]
fn opening_a_missing_device_is_a_clear_error() {
    match nvmf_rdma::Context::open("no-such-rdma-device0") {
        Err(nvmf_rdma::Error::NoSuchDevice(n)) => assert_eq!(n, "no-such-rdma-device0"),
        other => panic!("expected NoSuchDevice, got {other:?}"),
    }
}
