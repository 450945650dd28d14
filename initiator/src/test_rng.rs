//! The unit tests' random interleavings: xorshift64*, a small deterministic generator (a
//! failing interleaving repeats from its seed).

pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for run `seed` (any value; 0 is fine).
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Below `n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True `pct` times in 100.
    pub(crate) fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}
