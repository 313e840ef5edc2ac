//! The encoder's traces reshaped like real ones, for benchmarks: PAD-padded,
//! disable/enable-dense, or cut like a wrapped ring.
//!
//! In: a trace from [`super::encode`] (or any trace without errors). Out: a trace of the
//! same run with the packet mix real captures have and the random walk lacks (issue 19
//! measured a real KVM-PT trace as a third PADs, with a TIP.PGD/TIP.PGE pair per ~5 TIPs,
//! and snapshot rings start mid-packet):
//! - [`Shape::Padded`]: half a PAD per byte after each packet outside PSB+, a third of
//!   the bytes (PADs change nothing: the same branch events at other offsets);
//! - [`Shape::DisableEnable`]: every 4th TIP outside PSB+ becomes `TIP.PGD` (IP
//!   suppressed) and `TIP.PGE` at the TIP's target (a full address): the indirect branch
//!   leaves the traced code and tracing resumes where it went, as at a system call of a
//!   user-only trace, so the flow is the same with a trace stop and start where that
//!   branch was;
//! - [`Shape::Wrapped`]: the first third of the bytes cut off, so decoding starts
//!   mid-stream and synchronizes at the next PSB, as in an overwritten ring.
//!
//! Why here: the synthetic benchmark (100 MB/s) said nothing about real traces (20-50
//! MB/s): its traces had none of these.

use crate::decode::pt::packets::cpu::Errata;
use crate::decode::pt::packets::decoder::PacketDecoder;
use crate::decode::pt::packets::last_ip::LastIp;
use crate::decode::pt::packets::packet::Packet;

/// How to reshape a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Padded,
    DisableEnable,
    Wrapped,
}

impl Shape {
    pub const ALL: [Self; 3] = [Self::Padded, Self::DisableEnable, Self::Wrapped];

    /// A short name, for file names and tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Padded => "padded",
            Self::DisableEnable => "disable-enable",
            Self::Wrapped => "wrapped",
        }
    }
}

/// `trace` reshaped; `None` where a packet could not be decoded (not an encoder trace).
pub fn reshape(trace: &[u8], shape: Shape) -> Option<Vec<u8>> {
    if shape == Shape::Wrapped {
        return Some(trace.get(trace.len() / 3..)?.to_vec());
    }
    let mut out = Vec::with_capacity(trace.len() + trace.len() / 2);
    let mut packets = PacketDecoder::new(trace, Errata::default()).peekable();
    let (mut last, mut tips) = (0, 0u64);
    let mut ip = LastIp::new();
    let mut in_psb = false;
    while let Some(item) = packets.next() {
        let (offset, packet) = item.ok()?;
        let end = packets.peek().map_or(trace.len(), |next| {
            next.as_ref().map_or(trace.len(), |n| n.0)
        });
        out.extend_from_slice(trace.get(last..offset)?);
        let bytes = trace.get(offset..end)?;
        last = end;
        match packet {
            Packet::Psb => in_psb = true,
            Packet::PsbEnd => in_psb = false,
            _ => {}
        }
        if let Packet::Tip(payload)
        | Packet::TipPge(payload)
        | Packet::TipPgd(payload)
        | Packet::Fup(payload) = packet
        {
            ip.update(payload);
        }
        match (shape, packet) {
            (Shape::DisableEnable, Packet::Tip(_)) if !in_psb => {
                tips += 1;
                if tips.is_multiple_of(4)
                    && let Ok(target) = ip.ip()
                {
                    // TIP.PGD, IP suppressed; TIP.PGE with 48 bits, sign-extended.
                    out.push(0x01);
                    out.push(0x71);
                    out.extend_from_slice(&target.to_le_bytes()[..6]);
                } else {
                    out.extend_from_slice(bytes);
                }
            }
            _ => out.extend_from_slice(bytes),
        }
        if shape == Shape::Padded && !in_psb {
            // Half a PAD per byte of packet: a third of the trace, as in the KVM-PT one.
            out.resize(out.len() + bytes.len().div_ceil(2), 0x00);
        }
    }
    out.extend_from_slice(trace.get(last..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::pt::flow::block::FlowConfig;
    use crate::decode::pt::flow::branches::{BranchEvent, BranchKind, Branches};
    use crate::decode::pt::flow::image::Image;
    use crate::decode::pt::tools::encode::{CODE_BASE, SynthProgram, encode};

    fn events(trace: &[u8], image: &Image) -> Vec<BranchEvent> {
        Branches::new(trace, image, FlowConfig::default()).collect()
    }

    fn flow(events: &[BranchEvent]) -> Vec<(BranchKind, u64, u64)> {
        events
            .iter()
            .filter(|e| !matches!(e.kind, BranchKind::TraceStart | BranchKind::TraceStop))
            .map(|e| (e.kind, e.from, e.to))
            .collect()
    }

    #[test]
    fn reshaped_traces_keep_the_flow_of_the_run() {
        for seed in 1..6 {
            let program = SynthProgram::generate(seed, 12);
            let trace = encode(&program, seed, 64 << 10, false).trace;
            let mut image = Image::new();
            image.add("synth", program.code.clone(), CODE_BASE);
            let plain = events(&trace, &image);
            let count =
                |events: &[BranchEvent], kind| events.iter().filter(|e| e.kind == kind).count();
            assert_eq!(count(&plain, BranchKind::Error), 0, "seed {seed}");

            let padded = reshape(&trace, Shape::Padded).unwrap();
            assert!(
                padded.len() > trace.len() * 5 / 4,
                "seed {seed}: {} bytes",
                padded.len()
            );
            let got = events(&padded, &image);
            let kinds =
                |e: &[BranchEvent]| e.iter().map(|e| (e.kind, e.from, e.to)).collect::<Vec<_>>();
            assert!(kinds(&got) == kinds(&plain), "seed {seed}: padded");

            // The branches that became a stop and a start are gone from the flow, all the
            // others are there in order.
            let toggled = reshape(&trace, Shape::DisableEnable).unwrap();
            let got = events(&toggled, &image);
            assert_eq!(count(&got, BranchKind::Error), 0, "seed {seed}");
            let stops = count(&got, BranchKind::TraceStop);
            assert!(stops > 50, "seed {seed}: {stops} stops");
            assert_eq!(
                count(&got, BranchKind::TraceStart),
                stops + 1,
                "seed {seed}"
            );
            let (all, kept) = (flow(&plain), flow(&got));
            assert_eq!(all.len(), kept.len() + stops, "seed {seed}");
            let mut rest = all.iter();
            assert!(
                kept.iter().all(|k| rest.any(|a| a == k)),
                "seed {seed}: the flow is not a subsequence of the run's"
            );

            // From the first PSB after the cut on, the run's flow.
            let wrapped = reshape(&trace, Shape::Wrapped).unwrap();
            let got = events(&wrapped, &image);
            assert_eq!(count(&got, BranchKind::Error), 0, "seed {seed}");
            let (all, tail) = (flow(&plain), flow(&got));
            assert!(tail.len() > all.len() / 2, "seed {seed}");
            assert!(all.ends_with(&tail), "seed {seed}: wrapped");
        }
    }
}
