//! Rebuild the eBPF object when bpf-linker changes (aya-template does the same): a new
//! linker built against a new libLLVM must relink the programs.
use which::which;

fn main() {
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
