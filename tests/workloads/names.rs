//! Function names as Rust people write them, for the name-resolution tests: a module
//! function, a generic function with two instances, a trait method. Each is called a known
//! number of times (the test counts entry triggers).
//! Build: rustc --edition 2021 -C opt-level=1 -g --crate-name names names.rs
use std::hint::black_box;

mod engine {
    /// Called 3 times.
    #[inline(never)]
    pub fn slow_path(x: u64) -> u64 {
        std::hint::black_box(x.wrapping_mul(31) ^ 7)
    }
}

/// Instances for u8 (called 3 times) and u32 (2 times).
#[inline(never)]
fn widen<T: Copy + Into<u64>>(t: T) -> u64 {
    black_box(t.into() + 1)
}

trait Shape {
    fn area(&self) -> u64;
}

struct Square(u64);

impl Shape for Square {
    /// Called 4 times.
    #[inline(never)]
    fn area(&self) -> u64 {
        black_box(self.0 * self.0)
    }
}

fn main() {
    let mut sum = 0u64;
    for i in 0..3u64 {
        sum = sum.wrapping_add(engine::slow_path(black_box(i)));
        sum = sum.wrapping_add(widen(black_box(i as u8)));
    }
    for i in 0..2u32 {
        sum = sum.wrapping_add(widen(black_box(i)));
    }
    let shapes: Vec<Box<dyn Shape>> = (1..=4).map(|i| Box::new(Square(i)) as Box<dyn Shape>).collect();
    for s in &shapes {
        sum = sum.wrapping_add(black_box(s).area());
    }
    println!("result={sum}");
}
