//! Unit tests of ptxed's sideband session: images from MMAP records, where switches land.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::capture::intel_pt::SIDEBAND_SAMPLE_TYPE;
use crate::decode::pt::events::event::EventKind;
use crate::decode::pt::flow::image::ImageProvider as _;
use crate::decode::pt::sideband::pevent::PeventConfig;
use crate::decode::pt::sideband::sb_context::ActiveImage;
use crate::test_support::sideband_record;

const MMAP: u32 = 1;
const COMM: u32 = 3;
const ITRACE_START: u32 = 12;
const COMM_EXEC: u16 = 1 << 13;

/// Files by name.
struct Files(HashMap<&'static str, Vec<u8>>);

impl SectionLoader for Files {
    fn load(&self, path: &str, offset: u64, size: u64) -> Result<Arc<[u8]>, LoadError> {
        let bytes = self.0.get(path).ok_or(LoadError::BadFile)?;
        let from = usize::try_from(offset).map_err(|_| LoadError::BeyondEnd)?;
        let len = usize::try_from(size).unwrap_or(usize::MAX);
        let tail = bytes.get(from..).ok_or(LoadError::BeyondEnd)?;
        Ok(Arc::from(&tail[..len.min(tail.len())]))
    }
}

fn mmap(pid: u32, addr: u64, name: &str, time: u64) -> Vec<u8> {
    let mut body = [pid.to_le_bytes(), pid.to_le_bytes()].concat();
    for field in [addr, 0x10, 0] {
        body.extend(field.to_le_bytes());
    }
    body.extend(name.as_bytes());
    body.push(0);
    sideband_record(MMAP, 0, &body, (pid, pid), time, 0)
}

fn event(kind: EventKind, tsc: u64, suppressed: bool) -> Event {
    let mut event = Event::new(kind);
    event.tsc = tsc;
    event.ip_suppressed = suppressed;
    event
}

/// Whether `context`'s image maps `addr`.
fn maps(context: &Arc<Context>, addr: u64) -> bool {
    let raw = Image::new();
    let active = ActiveImage::new(&raw);
    active.switch_to(Arc::clone(context));
    active.mapping(addr).is_ok()
}

fn session<'a>(data: &'a [u8], files: &'a Files, out: &mut String) -> Session<'a> {
    let stream = SidebandStream {
        name: "sb".to_owned(),
        data,
        config: PeventConfig {
            sample_type: SIDEBAND_SAMPLE_TYPE,
            kernel_start: 0xffff_8000_0000_0000,
            ..PeventConfig::default()
        },
        primary: true,
    };
    let output = SessionOutput {
        flags: SidebandFlags::default(),
        warnings: true,
        switches: true,
    };
    Session::new(vec![stream], Image::new(), files, output, out).unwrap()
}

#[test]
fn an_exec_switches_images_once_the_trace_leaves_user_space() {
    let files = Files(HashMap::from([
        ("a", vec![0x90; 16]),
        ("b", vec![0xc3; 16]),
    ]));
    let ids = [1u32.to_le_bytes(), 1u32.to_le_bytes()].concat();
    let mut comm = ids.clone();
    comm.extend(b"b\0");
    let mut data = mmap(1, 0x1000, "a", 0);
    data.extend(sideband_record(ITRACE_START, 0, &ids, (1, 1), 0, 0));
    data.extend(sideband_record(COMM, COMM_EXEC, &comm, (1, 1), 5, 0));
    data.extend(mmap(1, 0x2000, "b", 5));
    let mut out = String::new();
    let mut session = session(&data, &files, &mut out);

    let enabled = EventKind::Enabled {
        ip: 0x1000,
        resumed: false,
    };
    let change = session
        .on_event(&event(enabled, 1, false), &mut out)
        .unwrap();
    let first = change.switch_to.expect("tracing starts in pid 1");
    assert!(change.mapped && maps(&first, 0x1000));
    assert_eq!(out, "[context: pid-1]\n");

    // The exec is due, but the trace is still in user space: no switch yet.
    let tick = EventKind::Tick { ip: 0x1000 };
    let change = session.on_event(&event(tick, 6, false), &mut out).unwrap();
    assert!(change.switch_to.is_none() && change.mapped);
    assert!(maps(&first, 0x1000) && !maps(&first, 0x2000));

    // Tracing stops without an IP on the way into the kernel: the new image applies.
    let disabled = EventKind::Disabled { ip: 0 };
    let change = session
        .on_event(&event(disabled, 7, true), &mut out)
        .unwrap();
    let second = change.switch_to.expect("the exec'ed image");
    assert!(maps(&second, 0x2000) && !maps(&second, 0x1000));
    assert_eq!(out, "[context: pid-1]\n[context: pid-1]\n");
}

#[test]
fn unmappable_records_warn_and_missing_files_end_the_stream() {
    let files = Files(HashMap::new());
    let mut data = mmap(1, 0x1000, "//anon", 0);
    let missing_at = data.len();
    data.extend(mmap(1, 0x1000, "missing", 0));
    data.extend(mmap(1, 0x2000, "[heap]", 0));
    let mut out = String::new();
    let mut session = session(&data, &files, &mut out);
    let change = session
        .on_event(&event(EventKind::Tick { ip: 0x1000 }, 1, false), &mut out)
        .unwrap();
    assert!(change.switch_to.is_none());
    assert_eq!(
        out,
        format!(
            "[sb:0000000000000000 sideband warning: image section lost]\n\
             [sb:{missing_at:016x} sideband error: bad file]\n"
        )
    );
}
