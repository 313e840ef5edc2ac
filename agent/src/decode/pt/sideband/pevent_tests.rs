//! Unit tests of sideband record reading and time-ordered printing.

use super::*;

/// A record: header, body, then the given samples.
fn record(kind: u32, misc: u16, body: &[u8], samples: &[u64]) -> Vec<u8> {
    let size = 8 + body.len() + 8 * samples.len();
    let mut out = kind.to_le_bytes().to_vec();
    out.extend(misc.to_le_bytes());
    out.extend(u16::try_from(size).unwrap().to_le_bytes());
    out.extend(body);
    for s in samples {
        out.extend(s.to_le_bytes());
    }
    out
}

fn comm(pid: u32, tid: u32, name: &str) -> Vec<u8> {
    let mut body = pid.to_le_bytes().to_vec();
    body.extend(tid.to_le_bytes());
    body.extend(name.as_bytes());
    body.resize(8 + (name.len() + 1).next_multiple_of(8), 0);
    body
}

fn time_only() -> PeventConfig {
    PeventConfig {
        sample_type: PERF_SAMPLE_TIME,
        ..PeventConfig::default()
    }
}

#[test]
fn reads_a_comm_record_with_a_time_sample() {
    let bytes = record(
        PERF_RECORD_COMM,
        PERF_RECORD_MISC_COMM_EXEC,
        &comm(7, 8, "bash"),
        &[5],
    );
    let (rec, size) = read_record(&bytes, &time_only()).unwrap();
    assert_eq!(size, bytes.len());
    assert_eq!(rec.kind, PERF_RECORD_COMM);
    assert_eq!(rec.samples.time, Some(5));
    assert_eq!(rec.tsc, 5);
    let mut out = String::new();
    print_body(
        &rec,
        SidebandFlags {
            compact: true,
            ..SidebandFlags::default()
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(out, "PERF_RECORD_COMM.EXEC  7/8, bash");
}

#[test]
fn a_sample_config_picks_each_records_layout_by_its_identifier() {
    // Two events: id 9 records TID|TIME|IDENTIFIER, id 5 TIME|IDENTIFIER (perf's tracking
    // event and the PT event of one perf.data differ like this).
    let config = PeventConfig {
        sample_type: PERF_SAMPLE_TIME | PERF_SAMPLE_IDENTIFIER,
        sample_config: vec![
            (
                9,
                PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_IDENTIFIER,
            ),
            (5, PERF_SAMPLE_TIME | PERF_SAMPLE_IDENTIFIER),
        ],
        ..PeventConfig::default()
    };
    let body = comm(7, 8, "bash");
    let wide = record(PERF_RECORD_COMM, 0, &body, &[7 | (8 << 32), 30, 9]);
    let (rec, _) = read_record(&wide, &config).unwrap();
    assert_eq!(rec.samples.pid_tid, Some((7, 8)));
    assert_eq!(
        (rec.samples.time, rec.samples.identifier),
        (Some(30), Some(9))
    );
    let narrow = record(PERF_RECORD_COMM, 0, &body, &[31, 5]);
    let (rec, _) = read_record(&narrow, &config).unwrap();
    assert_eq!((rec.samples.pid_tid, rec.samples.time), (None, Some(31)));
    // An identifier the configuration does not name: the default type.
    let other = record(PERF_RECORD_COMM, 0, &body, &[32, 77]);
    let (rec, _) = read_record(&other, &config).unwrap();
    assert_eq!(
        (rec.samples.time, rec.samples.identifier),
        (Some(32), Some(77))
    );
    // Read with the wrong layout, a record is a size error, not a misread.
    assert_eq!(
        read_record(&wide, &time_only()).map(|(r, _)| r.kind),
        Err(PeventError::BadSize)
    );
}

#[test]
fn bad_records_are_errors_not_panics() {
    let cfg = time_only();
    assert_eq!(read_record(&[], &cfg).unwrap_err(), PeventError::End);
    // A size below the header size.
    assert_eq!(
        read_record(&record(3, 0, &[], &[])[..6], &cfg).unwrap_err(),
        PeventError::End
    );
    let mut small = record(PERF_RECORD_LOST, 0, &[0; 16], &[1]);
    small[6] = 4;
    assert_eq!(read_record(&small, &cfg).unwrap_err(), PeventError::BadSize);
    // A COMM whose name has no NUL inside the record.
    let bad = record(
        PERF_RECORD_COMM,
        0,
        &[1, 0, 0, 0, 1, 0, 0, 0, b'x', b'y'],
        &[],
    );
    assert_eq!(read_record(&bad, &cfg).unwrap_err(), PeventError::BadString);
    // Samples that do not fill the record exactly.
    let short = record(PERF_RECORD_ITRACE_START, 0, &[0; 8], &[]);
    assert_eq!(read_record(&short, &cfg).unwrap_err(), PeventError::BadSize);
    // A zero multiplier cannot convert time.
    let zero_mult = PeventConfig {
        time_mult: 0,
        ..cfg
    };
    let rec = record(PERF_RECORD_ITRACE_START, 0, &[0; 8], &[9]);
    assert_eq!(
        read_record(&rec, &zero_mult).unwrap_err(),
        PeventError::BadTimeConfig
    );
}

#[test]
fn session_prints_streams_merged_by_time() {
    let mut a = record(PERF_RECORD_ITRACE_START, 0, &[1, 0, 0, 0, 1, 0, 0, 0], &[1]);
    a.extend(record(
        PERF_RECORD_SWITCH,
        PERF_RECORD_MISC_SWITCH_OUT,
        &[],
        &[4],
    ));
    let b = record(PERF_RECORD_LOST_SAMPLES, 0, &[3, 0, 0, 0, 0, 0, 0, 0], &[2]);
    let streams = vec![
        SidebandStream {
            name: "a".into(),
            data: &a,
            config: time_only(),
            primary: true,
        },
        SidebandStream {
            name: "b".into(),
            data: &b,
            config: time_only(),
            primary: false,
        },
    ];
    let flags = SidebandFlags {
        compact: true,
        offset: true,
        ..SidebandFlags::default()
    };
    let mut out = String::new();
    let mut session = SidebandSession::new(streams, flags, &mut out).unwrap();
    session.print_until(2, &mut out).unwrap();
    assert_eq!(
        out,
        "0000000000000000  PERF_RECORD_ITRACE_START  1/1  { 1 }\n\
         0000000000000000  PERF_RECORD_LOST_SAMPLES  3  { 2 }\n"
    );
    out.clear();
    session.print_until(u64::MAX, &mut out).unwrap();
    assert_eq!(out, "0000000000000018  PERF_RECORD_SWITCH.OUT  { 4 }\n");
}

#[test]
fn random_sideband_bytes_never_panic() {
    let mut state = 0x1234_5678_9abc_def1_u64;
    for _ in 0..300 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let len = usize::try_from(state % 200).unwrap();
        let mut data: Vec<u8> = (0..len)
            .map(|i| state.to_le_bytes()[i % 8] ^ i.to_le_bytes()[0])
            .collect();
        if len >= 8 {
            // Plausible headers make the record paths run.
            data[0] = (state % 16) as u8;
            data[6] = u8::try_from(len.min(255)).unwrap();
            data[7] = 0;
        }
        let config = PeventConfig {
            sample_type: state & 0x1_02c6,
            ..PeventConfig::default()
        };
        let streams = vec![SidebandStream {
            name: "r".into(),
            data: &data,
            config,
            primary: true,
        }];
        let flags = SidebandFlags {
            compact: true,
            verbose: state & 1 == 1,
            ..SidebandFlags::default()
        };
        let mut out = String::new();
        let mut session = SidebandSession::new(streams, flags, &mut out).unwrap();
        session.print_until(u64::MAX, &mut out).unwrap();
    }
}
