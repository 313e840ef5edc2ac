//! Walking an Intel PT trace packet by packet.
//!
//! In: a trace byte slice and the recording CPU's errata. Out: `(offset, packet)` pairs
//! from [`PacketDecoder`]: it syncs forward to a PSB, decodes with
//! [`super::parse::decode_packet`], and after an error (which carries the offset and says
//! what was wrong) resyncs at the next PSB. Every packet consumes at least one byte and
//! errors come at strictly increasing offsets, so a walk ends on any input.

use super::cpu::Errata;
use super::packet::Packet;
use super::parse::{BlockContext, Decoded, PacketError, decode_packet};
use super::sync;

/// Where the iterator stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Not synchronized yet: the first call syncs forward.
    Start,
    Running,
    /// The last item was an error: the next call syncs to the next PSB.
    Resync,
    Done,
}

/// Walks a trace packet by packet.
///
/// As an [`Iterator`] it syncs to the first PSB, yields `Ok((offset, packet))` for each
/// packet, yields `Err` for a packet it cannot decode and then continues at the next PSB.
/// A trace without any PSB yields one [`PacketError::NoSync`]. For finer control use
/// [`PacketDecoder::sync_forward`], [`PacketDecoder::sync_set`] and
/// [`PacketDecoder::next_packet`].
#[derive(Debug, Clone)]
pub struct PacketDecoder<'a> {
    trace: &'a [u8],
    errata: Errata,
    /// Where the next packet starts; `None` before the first sync.
    pos: Option<usize>,
    /// The last PSB synced to or decoded.
    sync: Option<usize>,
    block: BlockContext,
    walk: Walk,
    last_error: Option<usize>,
}

impl<'a> PacketDecoder<'a> {
    pub fn new(trace: &'a [u8], errata: Errata) -> Self {
        Self {
            trace,
            errata,
            pos: None,
            sync: None,
            block: BlockContext::None,
            walk: Walk::Start,
            last_error: None,
        }
    }

    /// The trace being decoded.
    pub fn trace(&self) -> &'a [u8] {
        self.trace
    }

    /// The offset of the next packet (0 before the first sync).
    pub fn position(&self) -> usize {
        self.pos.unwrap_or(0)
    }

    /// The offset of the last PSB synced to or decoded.
    pub fn last_sync(&self) -> Option<usize> {
        self.sync
    }

    /// Moves to the next PSB after the current position (a PSB the last packet partly
    /// overlapped counts) and returns its offset.
    pub fn sync_forward(&mut self) -> Result<usize, PacketError> {
        let mut from = self.pos.unwrap_or(0);
        if self.sync.is_some() && self.sync == self.pos {
            from += sync::PSB_LEN;
        }
        let start = from - from.min(sync::PSB_LEN - 1);
        let found = sync::find_psb_forward(self.trace, start)
            .ok_or(PacketError::NoSync { offset: start })?;
        self.pos = Some(found);
        self.sync = Some(found);
        self.block = BlockContext::None;
        self.walk = Walk::Running;
        Ok(found)
    }

    /// Trusts `offset` to be a packet boundary and decodes from there (`ptdump --no-sync`).
    pub fn sync_set(&mut self, offset: usize) -> Result<(), PacketError> {
        if offset > self.trace.len() {
            return Err(PacketError::OutOfRange {
                offset,
                len: self.trace.len(),
            });
        }
        self.pos = Some(offset);
        self.sync = Some(offset);
        self.block = BlockContext::None;
        self.walk = Walk::Running;
        Ok(())
    }

    /// Whether `other` stands where this decoder stands (the parallel decoder's
    /// checkpoint test, over the same trace and errata). The iterator's error history
    /// (`last_error`) is left out: the event layer does not iterate.
    pub(crate) fn same_place(&self, other: &Self) -> bool {
        self.pos == other.pos
            && self.sync == other.sync
            && self.block == other.block
            && self.walk == other.walk
    }

    /// Steps over PAD bytes at the current position: what reading them one at a time as
    /// [`Packet::Pad`]s does (a PAD changes no block context), eight bytes at a time.
    pub(crate) fn skip_pads(&mut self) {
        if let Some(pos) = self.pos {
            self.pos = Some(super::parse_hot::skip_pad_runs(self.trace, pos));
        }
    }

    /// Goes on at `offset`, a packet boundary after TNT, TIP and PAD packets that the
    /// caller (the decode fast path) read itself.
    pub(crate) fn seek(&mut self, offset: usize) {
        self.pos = Some(offset);
        self.block = BlockContext::None;
    }

    /// Decodes the packet at the current position: `None` at the end of the trace. On an
    /// error the position stays put; call [`Self::sync_forward`] to go on.
    pub fn next_packet(&mut self) -> Option<Result<(usize, Packet), PacketError>> {
        self.next_decoded()
            .map(|result| result.map(|(offset, decoded)| (offset, decoded.packet)))
    }

    /// Like [`Self::next_packet`] but also says how many bytes the packet took.
    pub fn next_decoded(&mut self) -> Option<Result<(usize, Decoded), PacketError>> {
        let Some(offset) = self.pos else {
            return Some(Err(PacketError::NoSync { offset: 0 }));
        };
        if offset >= self.trace.len() {
            return None;
        }
        Some(self.decode_at(offset).map(|decoded| (offset, decoded)))
    }

    fn decode_at(&mut self, offset: usize) -> Result<Decoded, PacketError> {
        let decoded = decode_packet(self.trace, offset, self.errata, self.block)?;
        if matches!(decoded.packet, Packet::Psb) {
            self.sync = Some(offset);
        }
        self.block = self.block.after(&decoded.packet);
        self.pos = Some(offset + decoded.size);
        Ok(decoded)
    }
}

impl Iterator for PacketDecoder<'_> {
    type Item = Result<(usize, Packet), PacketError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.walk {
            Walk::Done => return None,
            Walk::Start => {
                if let Err(err) = self.sync_forward() {
                    self.walk = Walk::Done;
                    return Some(Err(err));
                }
            }
            Walk::Resync => {
                if self.sync_forward().is_err() {
                    self.walk = Walk::Done;
                    return None;
                }
            }
            Walk::Running => {}
        }
        match self.next_packet() {
            None => {
                self.walk = Walk::Done;
                None
            }
            Some(Ok(item)) => Some(Ok(item)),
            Some(Err(err)) => {
                // Errors come at increasing offsets; anything else would be a loop.
                let stuck = self.last_error.is_some_and(|last| err.offset() <= last);
                self.last_error = Some(err.offset());
                self.walk = if err.is_truncated() || stuck {
                    Walk::Done
                } else {
                    Walk::Resync
                };
                Some(Err(err))
            }
        }
    }
}
