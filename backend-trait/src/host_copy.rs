//! Large host memory copies split over threads: reading a freshly mapped file (or writing fresh
//! pages) faults one page at a time, so a 100 GB checkpoint copied on one thread takes minutes.

/// Threads one copy uses at most.
const MAX_THREADS: usize = 8;
/// Copies below this size stay on the calling thread.
const MIN_PARALLEL_BYTES: usize = 4 << 20;

/// `dst.copy_from_slice(src)`, split over up to 8 threads from 4 MiB on.
///
/// Panics (as `copy_from_slice`) when the lengths differ.
pub fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS));
    if threads == 1 || src.len() < MIN_PARALLEL_BYTES {
        dst.copy_from_slice(src);
        return;
    }
    assert_eq!(dst.len(), src.len(), "parallel_copy: lengths differ");
    let per = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(per).zip(src.chunks(per)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// `src.to_vec()` through [`parallel_copy`].
pub fn parallel_to_vec(src: &[u8]) -> Vec<u8> {
    if src.len() < MIN_PARALLEL_BYTES {
        return src.to_vec();
    }
    let mut out = vec![0u8; src.len()];
    parallel_copy(&mut out, src);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn copies_every_byte() {
        let src: Vec<u8> = (0..(9 << 20) + 7).map(|i| (i * 31 % 251) as u8).collect();
        assert_eq!(super::parallel_to_vec(&src), src);
        assert_eq!(super::parallel_to_vec(&src[..100]), &src[..100]);
    }
}
