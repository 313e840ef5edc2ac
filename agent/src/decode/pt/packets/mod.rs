//! The packet layer: trace bytes in, Intel PT packets out.
//!
//! In: the bytes of a trace and the recording CPU ([`cpu`]: family/model, and the errata
//! that follow from it). Out: [`packet::Packet`]s at their offsets, one at a time
//! ([`parse`]) or walked over a whole trace with resync at PSBs ([`decoder`], [`sync`]),
//! full IPs from compressed IP packets ([`last_ip`]), and the TNT/TIP packets of the fast
//! path read straight from the bytes (`parse_hot`). Its own layer because it knows the
//! packet encodings and nothing of time, events or code: everything above reads packets,
//! never bytes.

pub mod cpu;
pub mod decoder;
pub mod last_ip;
pub mod packet;
pub mod parse;
pub(super) mod parse_hot;
pub mod sync;
