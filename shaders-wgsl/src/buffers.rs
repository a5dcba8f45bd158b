//! Device memory: a size-bucketed buffer pool and row-split tensor storage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Buffers kept idle in the pool beyond this many bytes are freed instead.
const POOL_IDLE_LIMIT: u64 = 1 << 30;

/// Usage of every storage buffer the backend allocates.
pub(crate) const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::COPY_SRC);

/// Buffers keyed by their (bucketed) byte size; returned by [`Storage`] on drop.
pub(crate) struct Pool {
    device: wgpu::Device,
    max_bytes: u64,
    free: Mutex<(HashMap<u64, Vec<wgpu::Buffer>>, u64)>,
    /// Set when a buffer was dropped instead of pooled (cached bind groups must let go of it).
    evicted: AtomicBool,
}

impl Pool {
    pub(crate) fn new(device: wgpu::Device, max_bytes: u64) -> Self {
        Self {
            device,
            max_bytes,
            free: Mutex::new((HashMap::new(), 0)),
            evicted: AtomicBool::new(false),
        }
    }

    /// Rounds a request up to its bucket: 256-byte steps up to 64 KiB, then 1/8 of the next
    /// power of two, never beyond `max_bytes` (the largest binding).
    fn bucket(&self, bytes: u64) -> u64 {
        let bytes = bytes.max(4);
        let b = if bytes <= 65536 {
            bytes.div_ceil(256) * 256
        } else {
            let step = bytes.next_power_of_two() / 8;
            bytes.div_ceil(step) * step
        };
        if b > self.max_bytes {
            bytes.div_ceil(4) * 4
        } else {
            b
        }
    }

    /// A buffer of at least `bytes` bytes (contents undefined).
    pub(crate) fn get(&self, bytes: u64) -> wgpu::Buffer {
        let size = self.bucket(bytes);
        {
            let mut g = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(b) = g.0.get_mut(&size).and_then(|v| v.pop()) {
                g.1 -= size;
                return b;
            }
        }
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dayone-wgsl tensor"),
            size,
            usage: STORAGE_USAGE,
            mapped_at_creation: false,
        })
    }

    /// True (once) if a buffer was dropped instead of pooled since the last call.
    pub(crate) fn take_evicted(&self) -> bool {
        self.evicted.swap(false, Ordering::Relaxed)
    }

    fn put(&self, buf: wgpu::Buffer) {
        let size = buf.size();
        let mut g = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if g.1 + size > POOL_IDLE_LIMIT {
            self.evicted.store(true, Ordering::Relaxed);
            return; // dropped: wgpu frees it once pending work is done
        }
        g.1 += size;
        g.0.entry(size).or_default().push(buf);
    }
}

/// One device buffer holding elements `start..start + len` of a tensor (4 bytes each).
pub(crate) struct Chunk {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

/// The memory behind a tensor: one chunk, or several when it exceeds the largest binding.
pub(crate) struct Storage {
    pub(crate) chunks: Vec<Chunk>,
    pool: Arc<Pool>,
}

impl Storage {
    pub(crate) fn new(chunks: Vec<Chunk>, pool: Arc<Pool>) -> Self {
        Self { chunks, pool }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        for c in self.chunks.drain(..) {
            self.pool.put(c.buf);
        }
    }
}
