//! Helpers shared by the end-to-end tests (starting the target binary, free ports).
