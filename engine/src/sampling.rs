//! Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus, Holtzman et
//! al. 2020), with a per-sequence seeded RNG so that runs repeat.

use rand::{rngs::StdRng, Rng, SeedableRng};

/// How a sequence picks tokens and when it stops.
#[derive(Clone, Debug)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// RNG seed.
    pub seed: u64,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Keep generating past EOS (benchmarks).
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            max_tokens: 128,
            ignore_eos: false,
        }
    }
}

impl SamplingParams {
    /// True when the choice is the argmax (so it can be taken on the device).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Checks ranges; errors name the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            anyhow::bail!(
                "--temperature must be a finite number ≥ 0, got {}",
                self.temperature
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            anyhow::bail!("--top-p must be in (0, 1], got {}", self.top_p);
        }
        if self.max_tokens == 0 {
            anyhow::bail!("--max-tokens must be at least 1");
        }
        Ok(())
    }
}

/// A sampler bound to one sequence's RNG.
pub struct Sampler {
    rng: StdRng,
}

impl Sampler {
    /// A sampler seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Picks a token id from `logits` `[V]` (f32).
    pub fn sample(&mut self, logits: &[f32], p: &SamplingParams) -> u32 {
        if p.is_greedy() {
            return argmax(logits);
        }
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if p.top_k > 0 {
            idx.truncate(p.top_k);
        }
        let max = logits[idx[0]];
        let mut probs: Vec<f32> = idx
            .iter()
            .map(|&i| ((logits[i] - max) / p.temperature).exp())
            .collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = probs.len();
            for (i, &q) in probs.iter().enumerate() {
                cum += q;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            idx.truncate(keep);
        }
        let total: f32 = probs.iter().sum();
        let mut r = self.rng.random::<f32>() * total;
        for (i, &q) in probs.iter().enumerate() {
            if r < q {
                return idx[i] as u32;
            }
            r -= q;
        }
        idx[probs.len() - 1] as u32
    }
}

/// Index of the largest value (the first on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_limits_choice() {
        let logits = [0.0, 5.0, 4.9, -3.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        };
        assert_eq!(Sampler::new(1).sample(&logits, &p), 1);
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            ..Default::default()
        };
        let mut s = Sampler::new(7);
        for _ in 0..50 {
            assert_eq!(
                s.sample(&logits, &p),
                1,
                "top-p 0.5 keeps only the most likely token here"
            );
        }
        let p = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        let mut s = Sampler::new(3);
        let seen: std::collections::HashSet<u32> =
            (0..200).map(|_| s.sample(&logits, &p)).collect();
        assert!(
            seen.contains(&1) && seen.contains(&2),
            "temperature sampling explores: {seen:?}"
        );
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            top_k: 20,
            ..Default::default()
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(42);
            (0..20).map(|_| s.sample(&logits, &p)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(42);
            (0..20).map(|_| s.sample(&logits, &p)).collect()
        };
        assert_eq!(a, b);
    }
}
