//! Safe owner types over libibverbs and librdmacm.
