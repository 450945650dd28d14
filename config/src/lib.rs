//! nvmf-target configuration.
