//! When requests go out: arrival times (vLLM's Poisson / gamma process) and the dispatcher that
//! starts each request at its arrival time under an optional concurrency limit.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// A uniform draw in (0, 1] (never 0, so logs stay finite).
fn open_unit(rng: &mut StdRng) -> f64 {
    1.0 - rng.random::<f64>()
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u1 = open_unit(rng);
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// A Gamma(shape, scale) draw (Marsaglia–Tsang; shape < 1 through the `U^(1/shape)` boost).
pub fn gamma(shape: f64, scale: f64, rng: &mut StdRng) -> f64 {
    if shape < 1.0 {
        return gamma(shape + 1.0, scale, rng) * open_unit(rng).powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = open_unit(rng);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v * scale;
        }
    }
}

/// Arrival times in seconds from the start for `n` requests, the first at 0. With an infinite
/// `rate` (requests/s) all arrive at 0; otherwise gaps are Gamma(shape = `burstiness`,
/// scale = 1/(rate·burstiness)), mean 1/rate: burstiness 1 is a Poisson process, < 1 burstier,
/// > 1 more regular (vLLM's `--burstiness`).
pub fn arrival_offsets(n: usize, rate: f64, burstiness: f64, seed: u64) -> Vec<f64> {
    if !rate.is_finite() {
        return vec![0.0; n];
    }
    // Its own stream, so the arrivals do not depend on how many draws the dataset made.
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_a77a_1a15_0001);
    let scale = 1.0 / (rate * burstiness);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += gamma(burstiness, scale, &mut rng);
            }
            t
        })
        .collect()
}

/// Runs `make(i)` for every `i` in `0..offsets.len()`, starting it at `t0 + offsets[i]`
/// seconds and, with `max_concurrency`, only while fewer than that many run (the wait for a slot
/// is not part of the request's own timing: `make`'s future takes its send time when it starts).
/// `on_done` sees each result as it lands. Every 100 ms `stop()` is polled; when it turns true
/// the requests still pending or running are dropped. Results come back in request order,
/// `None` for the dropped ones.
pub async fn dispatch<T, F, Fut>(
    offsets: &[f64],
    max_concurrency: Option<usize>,
    t0: Instant,
    make: F,
    mut on_done: impl FnMut(usize, &T),
    stop: impl Fn() -> bool,
) -> Vec<Option<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let sem = max_concurrency.map(|n| Arc::new(Semaphore::new(n)));
    let mut set = JoinSet::new();
    for (i, &off) in offsets.iter().enumerate() {
        let fut = make(i);
        let sem = sem.clone();
        let at = t0 + Duration::from_secs_f64(off.max(0.0));
        set.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let _permit = match sem {
                Some(s) => s.acquire_owned().await.ok(),
                None => None,
            };
            (i, fut.await)
        });
    }
    let mut out: Vec<Option<T>> = (0..offsets.len()).map(|_| None).collect();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            r = set.join_next() => match r {
                None => break,
                Some(Ok((i, v))) => {
                    on_done(i, &v);
                    out[i] = Some(v);
                }
                // A task that panicked (none should) leaves its slot empty.
                Some(Err(_)) => {}
            },
            _ = tick.tick() => {
                if stop() {
                    set.abort_all();
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_mean_rate() {
        let offs = arrival_offsets(20_001, 8.0, 1.0, 0);
        assert_eq!(offs[0], 0.0);
        assert!(offs.windows(2).all(|w| w[1] >= w[0]));
        let rate = 20_000.0 / offs[20_000];
        assert!((rate - 8.0).abs() < 0.25, "mean rate {rate}");
        // Exponential gaps: coefficient of variation ≈ 1.
        let gaps: Vec<f64> = offs.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
        // Fixed seed, same arrivals.
        assert_eq!(offs, arrival_offsets(20_001, 8.0, 1.0, 0));
        assert_ne!(offs, arrival_offsets(20_001, 8.0, 1.0, 1));
    }

    #[test]
    fn gamma_burstiness_keeps_mean_changes_spread() {
        for b in [0.3, 2.0, 5.0] {
            let offs = arrival_offsets(20_001, 4.0, b, 3);
            let rate = 20_000.0 / offs[20_000];
            assert!(
                (rate - 4.0).abs() / 4.0 < 0.05,
                "burstiness {b}: rate {rate}"
            );
            let gaps: Vec<f64> = offs.windows(2).map(|w| w[1] - w[0]).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            // Gamma(k): cv = 1/sqrt(k).
            let cv = var.sqrt() / mean;
            let want = 1.0 / b.sqrt();
            assert!(
                (cv - want).abs() / want < 0.08,
                "burstiness {b}: cv {cv} want {want}"
            );
        }
    }

    #[test]
    fn infinite_rate_all_at_once() {
        assert_eq!(arrival_offsets(3, f64::INFINITY, 1.0, 0), vec![0.0; 3]);
    }

    #[test]
    fn dispatch_limits_concurrency_and_keeps_order() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let mut seen = 0;
        let out = rt.block_on(dispatch(
            &[0.0; 12],
            Some(3),
            Instant::now(),
            |i| {
                let (running, peak) = (running.clone(), peak.clone());
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    i * 10
                }
            },
            |_, _| seen += 1,
            || false,
        ));
        assert_eq!(seen, 12);
        assert_eq!(out, (0..12).map(|i| Some(i * 10)).collect::<Vec<_>>());
        assert_eq!(peak.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn dispatch_stop_drops_the_rest() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let t0 = Instant::now();
        let out = rt.block_on(dispatch(
            &[0.0, 30.0],
            None,
            t0,
            |i| async move { i },
            |_, _| {},
            || t0.elapsed() > Duration::from_millis(250),
        ));
        assert_eq!(out, vec![Some(0), None]);
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
