//! The timing layer: timing packets in, estimated TSC out.
//!
//! In: TSC, TMA, MTC, CYC and CBR packets in trace order and the recording's
//! [`time::TimingConfig`] (MTC frequency, CPUID leaf 0x15 ratio, nominal frequency). Out:
//! the estimated TSC at each packet and the CYC calibration ([`time`]), and a tracker
//! that applies whole packet streams with ptdump's rules ([`clock`]). Its own layer
//! because time is kept apart from control flow: the event layer and the ptdump dump
//! both feed it, with the same results.

pub mod clock;
pub mod time;
