//! `--elf` and `--raw` code for a raw trace: ELF segments where ptxed puts them, raw
//! bytes under their own name, later code over earlier.
use super::*;

#[test]
fn elf_specs_take_a_base_only_when_it_is_a_number() {
    assert_eq!(
        ElfSpec::parse("a.out:0x400000"),
        ElfSpec {
            path: "a.out".to_owned(),
            base: Some(0x40_0000)
        }
    );
    assert_eq!(ElfSpec::parse("dir:x/a.out").base, None);
    assert_eq!(ElfSpec::parse("dir:x/a.out").path, "dir:x/a.out");
    assert_eq!(ElfSpec::parse(":12").path, ":12");
}

#[test]
fn an_elf_maps_its_executable_segments_with_the_lowest_segment_at_base() {
    let exe = std::env::current_exe().unwrap();
    let bytes = std::fs::read(&exe).unwrap();
    let at_file = ElfSpec {
        path: exe.to_string_lossy().into_owned(),
        base: None,
    }
    .segments(&bytes)
    .unwrap();
    let lowest = {
        let elf = object::File::parse(&*bytes).unwrap();
        elf.segments().map(|s| s.address()).min().unwrap()
    };
    let moved = ElfSpec {
        path: exe.to_string_lossy().into_owned(),
        base: Some(0x7000_0000_0000),
    }
    .segments(&bytes)
    .unwrap();
    assert_eq!(at_file.len(), moved.len());
    for ((a, code_a), (b, code_b)) in at_file.iter().zip(&moved) {
        assert_eq!(b.start - a.start, 0x7000_0000_0000 - lowest);
        assert_eq!(code_a, code_b);
        assert_eq!(a.end - a.start, code_a.len() as u64);
        assert!(a.build_id.is_some());
        // The bytes are the file's at the segment's offset.
        let off = usize::try_from(a.offset).unwrap();
        assert_eq!(&bytes[off..off + code_a.len()], &code_a[..]);
    }
}

#[test]
fn not_an_elf_is_an_error_naming_the_file() {
    let err = ElfSpec::parse("code.bin")
        .segments(&[0x90; 16])
        .unwrap_err();
    assert!(
        err.to_string().starts_with("code.bin: not an ELF file"),
        "{err}"
    );
}

#[test]
fn later_code_shadows_earlier_and_raw_bytes_are_named_apart() {
    let spec = |addr| RawSpec {
        path: "c.bin".to_owned(),
        offset: 0,
        end: None,
        addr,
    };
    let first = raw_segment(&spec(0x1000), &[0x90; 32]);
    let second = raw_segment(&spec(0x1010), &[0xc3; 4]);
    assert_eq!(first.0.path, "[raw] c.bin");
    let snap = snapshot(vec![0x02, 0x82], vec![first, second], "t.pt");
    let maps = &snap.maps[0].maps;
    assert_eq!(maps.len(), 1, "the overlapped map is gone: {maps:?}");
    assert_eq!(maps[0].start, 0x1010);
    assert_eq!(snap.code.len(), 1);
    assert_eq!(snap.code[0].data, [0xc3; 4]);
    assert_eq!(snap.maps[0].comm, "t.pt");
    assert_eq!(snap.rings[0].data, [0x02, 0x82]);
}
