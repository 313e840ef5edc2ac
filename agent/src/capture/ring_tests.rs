//! Ring walking on synthetic buffers laid out the way the kernel writes them.

use super::*;

/// A record of `len` bytes (multiple of 8) whose body is `seq` repeated.
fn record(seq: u8, len: usize) -> Vec<u8> {
    let mut r = 9u32.to_le_bytes().to_vec(); // PERF_RECORD_SAMPLE
    r.extend(0u16.to_le_bytes());
    r.extend(u16::try_from(len).unwrap().to_le_bytes());
    r.resize(len, seq);
    r
}

/// Simulates the kernel's `write_backward` output: each record goes right before the
/// previous one, `head` counts down from 0. Returns (data area, head).
fn backward_ring(size: usize, records: &[Vec<u8>]) -> (Vec<u8>, u64) {
    let mut data = vec![0u8; size];
    let mut head = 0u64;
    for r in records {
        head = head.wrapping_sub(r.len() as u64);
        for (i, b) in r.iter().enumerate() {
            let at = usize::try_from((head.wrapping_add(i as u64)) % size as u64).unwrap();
            data[at] = *b;
        }
    }
    (data, head)
}

fn concat(records: &[Vec<u8>]) -> Vec<u8> {
    records.concat()
}

#[test]
fn not_wrapped_returns_everything_oldest_first() {
    let recs = vec![record(1, 16), record(2, 24), record(3, 32)];
    let (data, head) = backward_ring(256, &recs);
    let copy = walk_backward(&data, head);
    assert_eq!(copy.stop, WalkStop::Unwritten);
    assert_eq!(copy.records, 3);
    assert_eq!(copy.data, concat(&recs));
}

#[test]
fn head_at_zero_and_nothing_written_is_empty() {
    let copy = walk_backward(&[0u8; 128], 0);
    assert_eq!(copy.stop, WalkStop::Empty);
    assert_eq!((copy.records, copy.data.len()), (0, 0));
}

#[test]
fn exactly_full_ring_keeps_every_record() {
    let recs = vec![record(1, 64), record(2, 32), record(3, 32)];
    let (data, head) = backward_ring(128, &recs);
    assert_eq!(head % 128, 0, "head back at offset 0");
    let copy = walk_backward(&data, head);
    assert_eq!(copy.stop, WalkStop::Wrapped);
    assert_eq!(copy.data, concat(&recs));
}

#[test]
fn wrapped_ring_keeps_the_newest_complete_records() {
    // 20 records of 24 bytes through a 128-byte ring: 5 fit whole (120 bytes), the 6th
    // newest is partly overwritten and must be dropped.
    let recs: Vec<Vec<u8>> = (0..20).map(|i| record(i, 24)).collect();
    let (data, head) = backward_ring(128, &recs);
    let copy = walk_backward(&data, head);
    assert_eq!(copy.stop, WalkStop::Wrapped);
    assert_eq!(copy.records, 5);
    assert_eq!(copy.data, concat(&recs[15..]));
}

#[test]
fn a_record_straddling_the_end_is_reassembled() {
    // 40 + 40 bytes in a 64-byte ring: the newest (second) record starts at offset 48 and
    // continues at offset 0.
    let recs = vec![record(7, 40), record(8, 40)];
    let (data, head) = backward_ring(64, &recs);
    assert_eq!(head % 64, 48);
    let copy = walk_backward(&data, head);
    assert_eq!(copy.records, 1);
    assert_eq!(copy.data, record(8, 40));
    assert_eq!(copy.stop, WalkStop::Wrapped);
}

#[test]
fn zero_size_header_at_head_stops_at_once() {
    // head claims data but the header there is zero: no spin, nothing returned.
    let copy = walk_backward(&[0u8; 64], 0u64.wrapping_sub(16));
    assert_eq!(copy.stop, WalkStop::Empty);
    assert_eq!(copy.records, 0);
}

#[test]
fn header_larger_than_the_ring_is_rejected() {
    let mut data = vec![0u8; 64];
    data[..8].copy_from_slice(&record(1, 8)[..8]);
    data[6..8].copy_from_slice(&128u16.to_le_bytes());
    let copy = walk_backward(&data, 0);
    assert_eq!(
        copy.stop,
        WalkStop::BadHeader {
            offset: 0,
            size: 128
        }
    );
    assert!(copy.data.is_empty());
}

#[test]
fn bad_sizes_after_good_records_keep_the_good_ones() {
    let recs = vec![record(1, 16), record(2, 16)];
    let (mut data, head) = backward_ring(128, &recs);
    // Corrupt the older record's size to 12 (not a multiple of 8).
    let older = usize::try_from(head.wrapping_add(16) % 128).unwrap();
    data[older + 6..older + 8].copy_from_slice(&12u16.to_le_bytes());
    let copy = walk_backward(&data, head);
    assert_eq!(copy.records, 1);
    assert_eq!(copy.data, record(2, 16));
    assert!(matches!(copy.stop, WalkStop::BadHeader { size: 12, .. }));
    // A size below the header size.
    data[older + 6..older + 8].copy_from_slice(&4u16.to_le_bytes());
    assert!(matches!(
        walk_backward(&data, head).stop,
        WalkStop::BadHeader { size: 4, .. }
    ));
}

#[test]
fn degenerate_rings_do_not_panic() {
    assert_eq!(walk_backward(&[], 5).stop, WalkStop::Empty);
    assert_eq!(walk_backward(&[0u8; 12], 0).stop, WalkStop::Empty);
    assert!(matches!(
        walk_backward(&[0u8; 64], 3).stop,
        WalkStop::BadHeader { offset: 3, .. }
    ));
    // Garbage everywhere: must terminate.
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()[1])
        .collect();
    for head in [0u64, 8, 4088, u64::MAX - 7] {
        let _ = walk_backward(&garbage, head);
    }
}

#[test]
fn forward_drain_handles_wrap_and_stops_at_bad_headers() {
    let size = 64usize;
    let mut data = vec![0u8; size];
    // Records at counters 48..72 (wraps) and 72..88.
    let a = record(1, 24);
    let b = record(2, 16);
    for (i, byte) in a.iter().chain(&b).enumerate() {
        data[(48 + i) % size] = *byte;
    }
    let mut out = Vec::new();
    assert_eq!(drain_forward(&data, 48, 88, &mut out), (88, WalkStop::Head));
    assert_eq!(out, [a.clone(), b].concat());

    // A bad header stops the drain and skips to head.
    let mut out = Vec::new();
    data[(72 % size) + 6] = 3;
    let (tail, stop) = drain_forward(&data, 48, 88, &mut out);
    assert_eq!(tail, 88);
    assert!(matches!(stop, WalkStop::BadHeader { .. }));
    assert_eq!(out, a);
}

/// A fake perf ring: metadata page + `data` over anonymous memory.
fn fake_ring(data: &[u8], head: u64) -> PerfRing {
    let page = crate::sys::page_size().unwrap();
    let map = Mapping::anonymous(page + data.len()).unwrap();
    let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let mut ring = PerfRing::from_parts(fd, map, page);
    ring.fake_write(OFF_DATA_OFFSET, &(page as u64).to_le_bytes());
    ring.fake_write(OFF_DATA_SIZE, &(data.len() as u64).to_le_bytes());
    ring.fake_write(OFF_DATA_HEAD, &head.to_le_bytes());
    ring.fake_write(page, data);
    ring
}

#[test]
fn perf_ring_over_fake_memory_copies_backward() {
    // 200 records of 40 bytes through 4096 bytes: the newest 102 fit whole.
    let recs: Vec<Vec<u8>> = (0..200).map(|i| record(i, 40)).collect();
    let (data, head) = backward_ring(4096, &recs);
    let ring = fake_ring(&data, head);
    assert_eq!(ring.data_size(), 4096);
    assert_eq!(ring.head(), head);
    let copy = ring.copy_backward();
    assert_eq!(copy.stop, WalkStop::Wrapped);
    assert_eq!(copy.records, 102);
    assert_eq!(copy.data, concat(&recs[98..]));
}

#[test]
fn perf_ring_forward_drain_commits_the_tail() {
    let page = crate::sys::page_size().unwrap();
    let r = record(5, 32);
    let mut data = vec![0u8; 4096];
    data[..32].copy_from_slice(&r);
    let mut ring = fake_ring(&data, 32);
    let mut out = Vec::new();
    assert_eq!(ring.drain(&mut out), WalkStop::Head);
    assert_eq!(out, r);
    assert_eq!(ring.tail(), 32);
    // Nothing new: nothing appended.
    assert_eq!(ring.drain(&mut out), WalkStop::Head);
    assert_eq!(out.len(), 32);
    assert!(page >= 4096);
}

#[test]
fn page_clock_reads_the_published_conversion() {
    let mut ring = fake_ring(&[0u8; 64], 0);
    let word = (0x5555_5555u64 << 32) | (31u64 << 16) | 0x30;
    ring.fake_write(OFF_PMC_WIDTH, &word.to_le_bytes());
    ring.fake_write(OFF_TIME_ZERO, &123u64.to_le_bytes());
    ring.fake_write(OFF_CAPS, &CAP_USER_TIME_ZERO.to_le_bytes());
    let clock = ring.clock();
    assert_eq!(
        clock,
        PageClock {
            time_zero: 123,
            time_mult: 0x5555_5555,
            time_shift: 31,
            valid: true
        }
    );
}

#[test]
fn walks_over_the_mapping_read_what_walks_over_a_copy_read() {
    // The rings are walked in place (no copy of the whole area); every walk must stop
    // where the slice walk stops, with the same records: wrapped and partial rings,
    // records split at the end of the area, bad headers, garbage.
    let recs: Vec<Vec<u8>> = (0..200)
        .map(|i| record(i, 8 * (1 + i as usize % 7)))
        .collect();
    let mut cases: Vec<(Vec<u8>, u64)> = [5usize, 60, 200]
        .into_iter()
        .map(|n| backward_ring(4096, &recs[..n]))
        .collect();
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()[1])
        .collect();
    for head in [0u64, 8, 4088, u64::MAX - 7, 3] {
        cases.push((garbage.clone(), head));
    }
    let (mut bad, head) = backward_ring(4096, &recs[..60]);
    let at = usize::try_from(head % 4096).unwrap() + 6;
    bad[at] = 3;
    cases.push((bad, head));
    for (data, head) in &cases {
        let ring = fake_ring(data, *head);
        assert_eq!(
            ring.copy_backward(),
            walk_backward(data, *head),
            "head {head}"
        );
    }
    // Forward: a record split at the end of the area, then one at its start.
    let mut data = vec![0u8; 64];
    let (a, b) = (record(1, 24), record(2, 16));
    for (i, byte) in a.iter().chain(&b).enumerate() {
        data[(48 + i) % 64] = *byte;
    }
    let mut ring = fake_ring(&data, 88);
    ring.fake_write(OFF_DATA_TAIL, &48u64.to_le_bytes());
    let mut out = Vec::new();
    assert_eq!(ring.drain(&mut out), WalkStop::Head);
    assert_eq!(out, [a, b].concat());
}

#[test]
fn a_limited_walk_keeps_only_the_newest_bytes() {
    // What a copy of a running ring trusts: records from the head back to the limit;
    // the older ones may have been overwritten during the copy.
    let recs = vec![record(1, 16), record(2, 24), record(3, 32), record(4, 16)];
    let (data, head) = backward_ring(256, &recs);
    let copy = walk_backward_within(data.as_slice(), head, 48);
    assert_eq!(copy.stop, WalkStop::Wrapped);
    assert_eq!(copy.data, concat(&recs[2..]));
    assert_eq!(
        walk_backward_within(data.as_slice(), head, 47).data,
        concat(&recs[3..])
    );
    assert_eq!(walk_backward_within(data.as_slice(), head, 0).records, 0);
    // A limit past the ring's size is the ring's size.
    assert_eq!(
        walk_backward_within(data.as_slice(), head, usize::MAX),
        walk_backward(&data, head)
    );
}
