//! nvmf-target library: controller core, backends, transports.
