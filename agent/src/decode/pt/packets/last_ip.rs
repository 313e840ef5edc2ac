//! Reconstructing full addresses from compressed IP packets.
//!
//! In: the [`IpPayload`]s of TIP, TIP.PGE, TIP.PGD and FUP in trace order. Out: the full
//! 64-bit IP each one stands for. IP packets may carry only the bytes that changed since
//! the last IP packet ("last IP"); this helper keeps that state. A PSB resets it (the
//! caller calls [`LastIp::reset`]), and a suppressed IP hides it until the next update.

use super::packet::{IpCompression, IpPayload};

/// Why there is no IP to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LastIpError {
    /// No IP packet with an address since the last reset.
    #[error("no IP yet")]
    NoIp,
    /// The last IP packet was suppressed (IP out of context).
    #[error("IP suppressed")]
    Suppressed,
}

/// The last-IP register of the Intel PT compression scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LastIp {
    ip: u64,
    have_ip: bool,
    suppressed: bool,
    /// Every bit of `ip` came from packets since the last doubt: a full or sign-extended
    /// address, then only updates of its low bits ([`LastIp::doubt`]).
    exact: bool,
}

/// Sign-extends the low `bits` (1..=64) bits of `value`.
#[inline]
pub fn sign_extend(value: u64, bits: u32) -> u64 {
    let bits = bits.clamp(1, 64);
    let high = u64::MAX.checked_shl(bits).unwrap_or(0);
    if value >> (bits - 1) & 1 == 1 {
        value | high
    } else {
        value & !high
    }
}

impl LastIp {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets everything (at a PSB or after a decode error): the last IP is 0 by the
    /// definition of a PSB, so an address compressed against it is exact.
    pub fn reset(&mut self) {
        *self = Self {
            exact: true,
            ..Self::default()
        };
    }

    /// Applies one IP packet's payload.
    #[expect(
        clippy::inline_always,
        reason = "a call per TIP was a tenth of the decode fast path's time"
    )]
    #[inline(always)]
    pub fn update(&mut self, payload: IpPayload) {
        let keep_high = |bits: u32| -> u64 {
            let mask = (1u64 << bits) - 1;
            (self.ip & !mask) | (payload.ip & mask)
        };
        self.ip = match payload.compression {
            IpCompression::Suppressed => {
                self.suppressed = true;
                return;
            }
            IpCompression::Update16 => keep_high(16),
            IpCompression::Update32 => keep_high(32),
            IpCompression::Update48 => keep_high(48),
            IpCompression::Sext48 => {
                self.exact = true;
                sign_extend(payload.ip, 48)
            }
            IpCompression::Full => {
                self.exact = true;
                payload.ip
            }
        };
        self.have_ip = true;
        self.suppressed = false;
    }

    /// The current full IP.
    #[inline]
    pub fn ip(&self) -> Result<u64, LastIpError> {
        if !self.have_ip {
            Err(LastIpError::NoIp)
        } else if self.suppressed {
            Err(LastIpError::Suppressed)
        } else {
            Ok(self.ip)
        }
    }

    /// Distrusts the high bits kept so far (trace was lost: they may be another place's),
    /// until the next full or sign-extended address.
    pub fn doubt(&mut self) {
        self.exact = false;
    }

    /// Whether the IP is known from packets since the last [`LastIp::doubt`] alone.
    pub fn is_exact(&self) -> bool {
        self.exact && self.have_ip && !self.suppressed
    }

    /// Applies `payload` and returns the IP it stands for.
    pub fn apply(&mut self, payload: IpPayload) -> Result<u64, LastIpError> {
        self.update(payload);
        self.ip()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(compression: IpCompression, ip: u64) -> IpPayload {
        IpPayload { compression, ip }
    }

    #[test]
    fn an_ip_is_exact_from_a_full_address_on_until_doubted() {
        let mut last = LastIp::new();
        last.update(ip(IpCompression::Update16, 0x1234));
        assert!(!last.is_exact(), "no PSB yet: the high bits are unknown");
        last.reset();
        last.update(ip(IpCompression::Update32, 0x40_1234));
        assert!(last.is_exact(), "against the PSB's 0");
        last.doubt();
        last.update(ip(IpCompression::Sext48, 0x7fff_0000_1000));
        assert!(last.is_exact());
        last.update(ip(IpCompression::Update16, 0x2000));
        assert!(last.is_exact(), "low bits on top of an exact address");
        last.doubt();
        last.update(ip(IpCompression::Update32, 0x3000));
        assert!(!last.is_exact(), "the high bits are from before the doubt");
        last.update(ip(IpCompression::Full, 0x4000));
        assert!(last.is_exact());
        last.update(ip(IpCompression::Suppressed, 0));
        assert!(!last.is_exact());
    }

    #[test]
    fn every_compression_combines_with_the_last_ip() {
        let mut last = LastIp::new();
        assert_eq!(last.ip(), Err(LastIpError::NoIp));
        assert_eq!(
            last.apply(ip(IpCompression::Full, 0x0a00_cccc_dddd_eeee)),
            Ok(0x0a00_cccc_dddd_eeee)
        );
        assert_eq!(
            last.apply(ip(IpCompression::Update48, 0xffff_eeee_ffff)),
            Ok(0x0a00_ffff_eeee_ffff)
        );
        assert_eq!(
            last.apply(ip(IpCompression::Update16, 0xdddd)),
            Ok(0x0a00_ffff_eeee_dddd)
        );
        assert_eq!(
            last.apply(ip(IpCompression::Sext48, 0xffff_dddd_eeee)),
            Ok(0xffff_ffff_dddd_eeee)
        );
        assert_eq!(
            last.apply(ip(IpCompression::Update32, 0xeeee_ffff)),
            Ok(0xffff_ffff_eeee_ffff)
        );
        assert_eq!(
            last.apply(ip(IpCompression::Sext48, 0x7fff_0000_1000)),
            Ok(0x7fff_0000_1000)
        );
    }

    #[test]
    fn suppressed_hides_the_ip_until_the_next_update() {
        let mut last = LastIp::new();
        last.update(ip(IpCompression::Full, 0x1000));
        assert_eq!(
            last.apply(ip(IpCompression::Suppressed, 0)),
            Err(LastIpError::Suppressed)
        );
        assert_eq!(last.apply(ip(IpCompression::Update16, 0x2000)), Ok(0x2000));
        last.reset();
        assert_eq!(
            last.apply(ip(IpCompression::Suppressed, 0)),
            Err(LastIpError::NoIp)
        );
    }
}
