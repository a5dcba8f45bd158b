//! `copy_rows`, `read_rows` and `write_rows` on tensors split across several device buffers
//! (a tiny forced chunk size), including a view whose rows straddle buffer boundaries. The
//! unsplit case runs in the conformance suite (`conformance::check_row_ops` in `check_all`).

use dayone_backend::{conformance, Backend, DType, HostTensor, TensorInfo};
use dayone_wgsl::{Options, WgslBackend};

fn small_chunks(bytes: u64) -> WgslBackend {
    WgslBackend::with_options(Options {
        max_chunk_bytes: Some(bytes),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("WGSL backend unavailable: {e:#}"))
}

fn ok(r: anyhow::Result<()>) {
    if let Err(e) = r {
        panic!("{e:#}");
    }
}

/// The whole row suite with two `[5, 3, 4]` f32 rows per buffer.
#[test]
fn row_ops_on_split_tensors() {
    let b = small_chunks(96);
    let t = b
        .upload(&HostTensor::from_f32(vec![5, 3, 4], &[0.0; 60]).unwrap())
        .unwrap();
    assert_eq!(t.num_chunks(), 3, "a [5, 3, 4] f32 tensor was not split");
    ok(conformance::check_row_ops(&b));
}

/// Rows `[2, 12]` viewed over `[6, 4]` storage in buffers of two storage rows: each view row
/// spans two buffers, and a copy within the view reads and writes pieces of the same buffers.
#[test]
fn rows_of_a_view_straddle_buffers() {
    let b = small_chunks(32);
    let values: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let t = b
        .upload(&HostTensor::from_f32(vec![6, 4], &values).unwrap())
        .unwrap();
    assert_eq!(t.num_chunks(), 3);
    let v = b.reshape(&t, &[2, 12]).unwrap();
    b.copy_rows(&v, &[(0, 1), (1, 0)]).unwrap();
    let swapped: Vec<f32> = (12..24).chain(0..12).map(|i| i as f32).collect();
    assert_eq!(b.download(&t).unwrap().to_f32(), swapped);
    let row1 = b.read_rows(&v, &[1]).unwrap();
    assert_eq!(row1.shape, [1, 12]);
    assert_eq!(row1.to_f32(), values[..12]);
    b.write_rows(&v, &[0], &row1).unwrap();
    let both: Vec<f32> = (0..12).chain(0..12).map(|i| i as f32).collect();
    assert_eq!(b.download(&t).unwrap().to_f32(), both);
    // Storage rows 1..3 (one in each of two buffers) to 4..6 and back through the host.
    b.copy_rows(&t, &[(1, 4), (2, 5)]).unwrap();
    let got = b.read_rows(&t, &[4, 5]).unwrap();
    assert_eq!(got.dtype, DType::F32);
    assert_eq!(got.to_f32(), both[4..12]);
    assert_eq!(t.shape(), [6, 4]);
}
