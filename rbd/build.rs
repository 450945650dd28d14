//! Generates the librados/librbd declarations from the system headers (Debian: librbd-dev,
//! librados-dev) and links both libraries.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rustc-link-lib=rbd");
    println!("cargo:rustc-link-lib=rados");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("rbd_(open|close|get_size|stat|get_features|aio_.*|update_watch|update_unwatch|invalidate_cache|flush|is_exclusive_lock_owner|lock_get_owners|lock_get_owners_cleanup|lock_break)")
        .allowlist_function("rados_(create|conf_read_file|conf_set|connect|shutdown|ioctx_create|ioctx_destroy|ioctx_set_namespace|version|get_instance_id|getaddrs|lock_exclusive|unlock|list_lockers|setxattr|rmxattr|getxattrs|getxattrs_next|getxattrs_end|write_full|read|remove|stat|getxattr|create_write_op|release_write_op|write_op_cmpxattr|write_op_setxattr|write_op_create|write_op_write_full|write_op_operate|watch3|unwatch2|watch_check|watch_flush|notify2|notify_ack|buffer_free)")
        .allowlist_var("RBD_FEATURE_.*|LIBRADOS_OP_FLAG_.*|LIBRADOS_LOCK_FLAG_.*|RBD_WRITE_ZEROES_.*")
        .allowlist_type("rbd_image_info_t")
        .size_t_is_usize(true)
        .layout_tests(false)
        .generate()
        .expect("bindgen: cannot generate librbd/librados bindings (install librbd-dev librados-dev)");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("cannot write bindings.rs");
}
