//! Unit tests of the ptdump formatter (the corpus test covers the full format).

use super::*;

const PSB: [u8; 16] = [
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
];

fn dump(trace: &[u8], args: &[&str]) -> String {
    let (opts, _) = PtdumpOptions::from_args(args).unwrap();
    let mut out = String::new();
    ptdump(trace, &opts, &mut out).unwrap();
    out
}

#[test]
fn prints_offset_name_and_payload_columns() {
    let mut trace = PSB.to_vec();
    trace.extend([0x99, 0x01]); // mode.exec cs.l
    trace.extend([0x7d, 0x00, 0x10, 0, 0, 0, 0]); // fup sext48 0x1000
    trace.extend([0x02, 0x23]); // psbend
    let out = dump(&trace, &[]);
    let expected = "0000000000000000  psb\n\
                    0000000000000010  mode.exec  cs.l\n\
                    0000000000000012  fup        3: 0000000000001000\n\
                    0000000000000019  psbend\n";
    assert_eq!(out, expected);
}

#[test]
fn lastip_and_raw_columns() {
    let mut trace = PSB.to_vec();
    trace.push(0x0d); // tip, suppressed: no IP yet
    trace.extend([0x2d, 0x34, 0x12]); // tip update16 on top of nothing
    let out = dump(&trace, &["--lastip", "--no-offset", "--raw"]);
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["02820282028202820282028202820282", "psb"]);
    assert_eq!(
        lines[1],
        ["[10:", "error", "tracking", "last-ip:", "no", "ip]"]
    );
    assert_eq!(
        lines[2],
        ["0d", "tip", "0:", "????????????????", "ip", "<unavailable>"]
    );
    let tip = [
        "2d3412",
        "tip",
        "1:",
        "????????????1234",
        "ip",
        "0000000000001234",
    ];
    assert_eq!(lines[3], tip);
    assert_eq!(lines.len(), 4);
}

#[test]
fn decode_errors_are_reported_and_dumping_resumes_at_the_next_psb() {
    let mut trace = PSB.to_vec();
    trace.extend([0x09, 0, 0, 0]);
    trace.extend(PSB);
    let out = dump(&trace, &["--no-offset"]);
    assert_eq!(
        out,
        "psb\n[10: error decoding packet: unknown opcode]\npsb\n"
    );
}

#[test]
fn nothing_is_printed_without_a_psb_and_unknown_cpus_are_diagnosed() {
    assert_eq!(dump(&[1, 2, 3, 4], &[]), "");
    assert_eq!(
        dump(&[], &["--cpu", "0/0"]),
        "[0: failed to determine errata: unknown cpu]\n"
    );
}

#[test]
fn random_traces_dump_without_panicking() {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let option_sets: [&[&str]; 4] = [
        &["--no-sync", "--raw", "--lastip", "--exec-mode"],
        &[
            "--time",
            "--time-delta",
            "--mtc-freq",
            "3",
            "--cpuid-0x15.eax",
            "1",
            "--cpuid-0x15.ebx",
            "5",
            "--nom-freq",
            "7",
        ],
        &[
            "--tcal",
            "--no-sync",
            "--keep-tcal-on-ovf",
            "--cpu",
            "6/78",
            "--mtc-freq",
            "0",
            "--cpuid-0x15.eax",
            "3",
            "--cpuid-0x15.ebx",
            "1",
        ],
        &[
            "--time",
            "--no-wall-clock",
            "--no-sync",
            "--cpu",
            "6/85",
            "--mtc-freq",
            "255",
        ],
    ];
    for round in 0..300 {
        let len = usize::try_from(next() % 400).unwrap();
        let mut trace: Vec<u8> = (0..len).map(|_| next().to_le_bytes()[4]).collect();
        if len > 40 {
            let at = usize::try_from(next() % (len as u64 - 16)).unwrap();
            trace[at..at + 16].copy_from_slice(&PSB);
        }
        let out = dump(&trace, option_sets[round % option_sets.len()]);
        assert!(out.len() < 200 * (len + 2));
    }
}
