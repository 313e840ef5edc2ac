use super::modules::{UnwindSections, placements};
use super::*;
use crate::capture::procmaps;

/// This test binary's maps, read now.
fn own_maps() -> ProcessMaps {
    procmaps::read_process(std::process::id(), 0).expect("own maps")
}

#[test]
fn each_mapped_image_with_code_is_placed_once_over_all_its_mappings() {
    let maps = own_maps();
    let placed = placements(&maps);
    let exe = std::fs::read_link("/proc/self/exe").expect("own exe");
    let own: Vec<_> = placed
        .iter()
        .filter(|p| p.entry.path == exe.to_string_lossy())
        .collect();
    assert_eq!(own.len(), 1, "{placed:#?}");
    let all: Vec<_> = maps
        .maps
        .iter()
        .filter(|m| m.path == own[0].entry.path)
        .collect();
    assert!(all.len() > 1, "an ELF file maps several segments");
    assert!(
        all.iter()
            .all(|m| own[0].avma.start <= m.start && m.end <= own[0].avma.end)
    );
    assert!(placed.iter().all(|p| p.entry.executable()));
    assert!(
        placed.iter().any(|p| p.entry.path.contains("libc")),
        "{placed:#?}"
    );
}

#[test]
fn a_file_with_cfi_becomes_a_module_at_its_load_bias() {
    let maps = own_maps();
    let placed = placements(&maps);
    let exe = std::fs::read_link("/proc/self/exe").expect("own exe");
    let own = placed
        .iter()
        .find(|p| p.entry.path == exe.to_string_lossy())
        .expect("own placement");
    let sections = UnwindSections::read_file(&exe).expect("own exe parses");
    // rustc's .eh_frame describes (nearly) all of .text: no debug file is looked for.
    assert!(sections.has_cfi() && !sections.cfi_is_thin());
    let module = sections.module(own).expect("a module");
    // The function this test is in is where the bias says it is.
    let here = a_file_with_cfi_becomes_a_module_at_its_load_bias as fn() as usize as u64;
    assert!(module.avma_range().contains(&here));
    let data = std::fs::read(&exe).expect("own exe");
    let file = object::File::parse(&*data).expect("ELF");
    let stated = crate::elf::segments::Segments::of(&file)
        .mapped_address(own.entry.offset, true)
        .expect("mapped offset");
    assert_eq!(module.base_avma(), own.entry.start - stated);
    // Not ELF, or ELF without CFI: no module.
    assert!(UnwindSections::parse(b"not an ELF image").is_none());
    assert!(UnwindSections::read_file(Path::new("/nonexistent")).is_none());
}

#[test]
fn without_maps_or_stack_the_ip_is_the_stack() {
    let mut unwinder = StackUnwinder::new(&[], &[]);
    let regs = UserRegs {
        ip: 0x40_1000,
        sp: 0x7ff0_0000,
        bp: 0,
    };
    let frames = unwinder.unwind(7, regs, &[]);
    assert_eq!(frames.first(), Some(&0x40_1000));
    assert!(frames.len() <= 2, "{frames:x?}");
    // A frame-pointer chain in the copy is still followed: bp → [saved bp, return].
    let sp = 0x7ff0_0000u64;
    let mut stack = Vec::new();
    stack.extend(0u64.to_le_bytes()); // sp + 0
    stack.extend(0u64.to_le_bytes()); // sp + 8: saved rbp (end of the chain)
    stack.extend(0x40_2005u64.to_le_bytes()); // sp + 16: return address
    let regs = UserRegs {
        ip: 0x40_1000,
        sp,
        bp: sp + 8,
    };
    let frames = unwinder.unwind(7, regs, &stack);
    assert_eq!(&frames[..2], &[0x40_1000, 0x40_2005], "{frames:x?}");
}

/// JIT code (an anonymous executable mapping: V8's, the JVM's code cache) has no CFI and
/// no module: each of its frames is left by the frame pointer chain (V8 keeps frame
/// pointers; the JVM with `-XX:+PreserveFramePointer`), up to the chain's end.
#[test]
fn jit_frames_without_cfi_are_walked_by_their_frame_pointers() {
    let mut maps = own_maps();
    let jit = 0x1000_0000_0000u64;
    maps.maps.push(crate::capture::MapEntry::anonymous_code(
        jit,
        jit + 0x1_0000,
    ));
    let pid = maps.pid;
    let maps = [maps];
    let mut unwinder = StackUnwinder::new(&maps, &[]);
    // Two JIT frames: the leaf's bp → [bp of its caller, return into the caller's JIT
    // code], that one's → [0 (end of the chain), return into the outermost JIT code].
    let sp = 0x7ff0_0000u64;
    let mut stack = vec![0u8; 0x60];
    let mut put = |at: u64, value: u64| {
        let at = usize::try_from(at - sp).expect("offset");
        stack[at..at + 8].copy_from_slice(&value.to_le_bytes());
    };
    put(sp + 0x10, sp + 0x30); // leaf frame: saved bp of its caller
    put(sp + 0x18, jit + 0x2005); // and the return into the caller
    put(sp + 0x30, 0); // the caller's frame: end of the chain
    put(sp + 0x38, jit + 0x3005);
    let regs = UserRegs {
        ip: jit + 0x1010,
        sp,
        bp: sp + 0x10,
    };
    let frames = unwinder.unwind(pid, regs, &stack);
    assert_eq!(
        &frames[..3],
        &[jit + 0x1010, jit + 0x2005, jit + 0x3005],
        "{frames:x?}"
    );
}
