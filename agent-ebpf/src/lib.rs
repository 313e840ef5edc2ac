//! This file exists to enable the library target, so that `agent` can list this crate as a
//! build-dependency and be rebuilt when it changes (aya-template).
#![no_std]
