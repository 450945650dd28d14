//! NVMe-oF initiator library.
