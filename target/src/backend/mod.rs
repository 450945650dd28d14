//! Storage backends (being written).
