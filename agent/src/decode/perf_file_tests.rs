//! perf.data files built byte by byte as perf lays them out (file and pipe mode), read
//! back; and every cut of one, which must never panic and keeps what came before. The
//! reader is compared with perf itself on files perf wrote in
//! `tests/tests/decode_inputs.rs`.
use super::*;

/// A `perf_event_attr`'s bytes and its ids.
pub type AttrWithIds = (Vec<u8>, Vec<u64>);

/// `perf_event_attr` (size 112) of `kind`/`config`/`sample_type`, `sample_id_all` set.
pub fn attr_bytes(kind: u32, config: u64, sample_type: u64) -> Vec<u8> {
    let mut a = vec![0u8; 112];
    a[0..4].copy_from_slice(&kind.to_le_bytes());
    a[4..8].copy_from_slice(&112u32.to_le_bytes());
    a[8..16].copy_from_slice(&config.to_le_bytes());
    a[24..32].copy_from_slice(&sample_type.to_le_bytes());
    a[40..48].copy_from_slice(&ATTR_SAMPLE_ID_ALL.to_le_bytes());
    a
}

/// A record: header and `body`.
pub fn record(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&kind.to_le_bytes());
    r.extend_from_slice(&misc.to_le_bytes());
    r.extend_from_slice(&u16::try_from(8 + body.len()).unwrap().to_le_bytes());
    r.extend_from_slice(body);
    r
}

/// `PERF_RECORD_AUXTRACE` for `data` of mmap `idx` on `cpu`, and the data.
pub fn auxtrace(idx: u32, cpu: u32, tid: u32, data: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(data.len() as u64).to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&7u64.to_le_bytes());
    body.extend_from_slice(&idx.to_le_bytes());
    body.extend_from_slice(&tid.to_le_bytes());
    body.extend_from_slice(&cpu.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    let mut r = record(PERF_RECORD_AUXTRACE, 0, &body);
    r.extend_from_slice(data);
    r
}

/// `PERF_RECORD_AUXTRACE_INFO` of type `kind` with `words`.
pub fn auxtrace_info(kind: u32, words: &[u64]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&kind.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    for w in words {
        body.extend_from_slice(&w.to_le_bytes());
    }
    record(PERF_RECORD_AUXTRACE_INFO, 0, &body)
}

/// A build-id entry (pid -1, 20-byte id of `byte`, `path`).
fn build_id_event(byte: u8, path: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(-1i32).to_le_bytes());
    let mut id = [byte; 24];
    id[20] = 20;
    body.extend_from_slice(&id);
    let mut name = path.as_bytes().to_vec();
    name.resize((name.len() + 8) & !7, 0);
    body.extend_from_slice(&name);
    record(PERF_RECORD_HEADER_BUILD_ID, MISC_BUILD_ID_SIZE, &body)
}

fn header_string_bytes(s: &str) -> Vec<u8> {
    let mut text = s.as_bytes().to_vec();
    text.resize((text.len() + 8) & !7, 0);
    let mut out = u32::try_from(text.len()).unwrap().to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out
}

/// A file-mode perf.data: `attrs` (each with its ids), the `data` records, and the
/// build-id and OS release features.
pub fn file_mode(attrs: &[AttrWithIds], data: &[u8], build_ids: &[(u8, &str)]) -> Vec<u8> {
    let attr_size: u64 = 112 + 16;
    let mut out = vec![0u8; 104];
    // The ids, then the attrs, then the data, then the feature table and sections.
    let mut id_sections = Vec::new();
    for (_, ids) in attrs {
        id_sections.push((out.len() as u64, (ids.len() * 8) as u64));
        for id in ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
    }
    let attrs_at = out.len() as u64;
    for ((raw, _), (off, size)) in attrs.iter().zip(&id_sections) {
        out.extend_from_slice(raw);
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
    }
    let data_at = out.len() as u64;
    out.extend_from_slice(data);
    let table_at = out.len();
    out.resize(table_at + 32, 0);
    let builds: Vec<u8> = build_ids
        .iter()
        .flat_map(|(b, p)| build_id_event(*b, p))
        .collect();
    let release = header_string_bytes("6.1.0-test");
    let mut sections = Vec::new();
    for body in [&builds, &release] {
        sections.push((out.len() as u64, body.len() as u64));
        out.extend_from_slice(body);
    }
    for (i, (off, size)) in sections.iter().enumerate() {
        let at = table_at + i * 16;
        out[at..at + 8].copy_from_slice(&off.to_le_bytes());
        out[at + 8..at + 16].copy_from_slice(&size.to_le_bytes());
    }
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&104u64.to_le_bytes());
    out[16..24].copy_from_slice(&attr_size.to_le_bytes());
    out[24..32].copy_from_slice(&attrs_at.to_le_bytes());
    out[32..40].copy_from_slice(&(attrs.len() as u64 * attr_size).to_le_bytes());
    out[40..48].copy_from_slice(&data_at.to_le_bytes());
    out[48..56].copy_from_slice(&(data.len() as u64).to_le_bytes());
    let features: u64 = 1 << HEADER_BUILD_ID | 1 << HEADER_OSRELEASE;
    out[72..80].copy_from_slice(&features.to_le_bytes());
    out
}

/// The same content in pipe mode: attrs and build-ids as records, then `data`.
pub fn pipe_mode(attrs: &[AttrWithIds], data: &[u8], build_ids: &[(u8, &str)]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&16u64.to_le_bytes());
    for (raw, ids) in attrs {
        let mut body = raw.clone();
        for id in ids {
            body.extend_from_slice(&id.to_le_bytes());
        }
        out.extend(record(PERF_RECORD_HEADER_ATTR, 0, &body));
    }
    let mut feature = u64::from(HEADER_OSRELEASE).to_le_bytes().to_vec();
    feature.extend(header_string_bytes("6.1.0-test"));
    out.extend(record(PERF_RECORD_HEADER_FEATURE, 0, &feature));
    out.extend_from_slice(data);
    for (b, p) in build_ids {
        out.extend(build_id_event(*b, p));
    }
    out
}

/// A small recording: a PT attr and a tracking attr, an `AUXTRACE_INFO`, a COMM, an AUX
/// chunk with 5 bytes, another record.
fn sample_data() -> (Vec<AttrWithIds>, Vec<u8>) {
    let st = 1 << 1 | 1 << 2 | 1 << 7 | 1 << 16;
    let attrs = vec![
        (attr_bytes(8, 0x0300_e601, st), vec![11, 12]),
        (attr_bytes(1, 9, st), vec![21]),
    ];
    let mut data = auxtrace_info(1, &[8, 31, 1000, 5]);
    let mut comm = Vec::new();
    comm.extend_from_slice(&42u32.to_le_bytes());
    comm.extend_from_slice(&42u32.to_le_bytes());
    comm.extend_from_slice(b"echo\0\0\0\0");
    comm.extend_from_slice(&[0u8; 32]);
    data.extend(record(3, 0, &comm));
    data.extend(auxtrace(0, 0, 42, &[0x02, 0x82, 0x02, 0x82, 0x00]));
    data.extend(record(15, 0, &[0u8; 40]));
    (attrs, data)
}

fn check(file: &PerfFile) {
    assert_eq!(file.attrs.len(), 2);
    assert_eq!(file.attrs[0].kind, 8);
    assert_eq!(file.attrs[0].config, 0x0300_e601);
    assert!(file.attrs[0].sample_id_all);
    assert_eq!(file.attrs[0].ids, [11, 12]);
    assert_eq!(file.attr_of(21).map(|a| a.kind), Some(1));
    assert_eq!(file.auxtrace_info, Some((1, vec![8, 31, 1000, 5])));
    assert_eq!(
        file.records.iter().map(|r| r.kind).collect::<Vec<_>>(),
        [3, 15]
    );
    assert_eq!(file.aux.len(), 1);
    assert_eq!(file.aux[0].data, [0x02, 0x82, 0x02, 0x82, 0x00]);
    assert_eq!(
        (file.aux[0].idx, file.aux[0].cpu, file.aux[0].tid),
        (0, 0, 42)
    );
    assert_eq!(file.build_ids.len(), 1);
    assert_eq!(file.build_ids[0].build_id, "ab".repeat(20));
    assert_eq!(file.build_ids[0].path, "/bin/echo");
    assert_eq!(file.os_release.as_deref(), Some("6.1.0-test"));
    assert_eq!(file.stopped, None);
}

#[test]
fn file_and_pipe_mode_read_the_same() {
    let (attrs, data) = sample_data();
    let ids = [(0xab, "/bin/echo")];
    let bytes = file_mode(&attrs, &data, &ids);
    let file = PerfFile::parse(&bytes).unwrap();
    assert!(!file.pipe);
    check(&file);
    let bytes = pipe_mode(&attrs, &data, &ids);
    let file = PerfFile::parse(&bytes).unwrap();
    assert!(file.pipe);
    check(&file);
}

#[test]
fn every_cut_of_a_file_reads_what_came_before_it() {
    let (attrs, data) = sample_data();
    for bytes in [
        file_mode(&attrs, &data, &[(0xab, "/bin/echo")]),
        pipe_mode(&attrs, &data, &[(0xab, "/bin/echo")]),
    ] {
        let whole = PerfFile::parse(&bytes).unwrap();
        for len in 0..bytes.len() {
            let Ok(cut) = PerfFile::parse(&bytes[..len]) else {
                continue;
            };
            // Never more than the whole file has, in the same order.
            assert!(cut.records.len() <= whole.records.len());
            assert_eq!(cut.records[..], whole.records[..cut.records.len()]);
            for (c, w) in cut.aux.iter().zip(&whole.aux) {
                assert!(w.data.starts_with(c.data), "cut at {len}");
            }
        }
    }
}

#[test]
fn a_cut_aux_chunk_keeps_its_bytes_and_says_where_it_stopped() {
    let (attrs, data) = sample_data();
    let bytes = pipe_mode(&attrs, &data, &[]);
    // Up to 2 of the 5 trace bytes.
    let aux_end = bytes.len() - 48;
    let cut = PerfFile::parse(&bytes[..aux_end - 3]).unwrap();
    assert_eq!(cut.aux[0].data, [0x02, 0x82]);
    let (_, why) = cut.stopped.unwrap();
    assert!(why.contains("AUX data of 5 bytes cut after 2"), "{why}");
    let file = file_mode(&attrs, &data, &[]);
    let cut = PerfFile::parse(&file[..file.len() - 100]).unwrap();
    assert!(cut.stopped.is_some());
    assert_eq!(cut.records.len(), 1, "the COMM before the cut");
}

#[test]
fn what_is_no_perf_data_says_what_it_is() {
    assert_eq!(PerfFile::parse(b"hello"), Err(PerfFileError::NotPerfData));
    assert_eq!(
        PerfFile::parse(b"2ELIFREP\0\0\0\0\0\0\0\x68"),
        Err(PerfFileError::BigEndian)
    );
    let mut pipe = MAGIC.to_vec();
    pipe.extend_from_slice(&16u64.to_le_bytes());
    pipe.extend(record(PERF_RECORD_COMPRESSED, 0, &[0u8; 8]));
    assert_eq!(PerfFile::parse(&pipe), Err(PerfFileError::Compressed));
    let mut file = MAGIC.to_vec();
    file.extend_from_slice(&104u64.to_le_bytes());
    assert_eq!(PerfFile::parse(&file), Err(PerfFileError::ShortHeader(16)));
}
