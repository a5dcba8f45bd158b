//! Prints a GGUF file's metadata (arrays abbreviated) and tensor infos.
use dayone_engine::loader::{GgufFile, MetaValue};
fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).expect("usage: gguf_dump FILE");
    let f = GgufFile::open(std::path::Path::new(&path))?;
    println!(
        "version {} alignment {} data_start {}",
        f.version, f.alignment, f.data_start
    );
    for (k, v) in &f.metadata {
        match v {
            MetaValue::Array(a) => {
                println!("{k}: array[{}] first {:?}", a.len(), &a[..a.len().min(12)])
            }
            MetaValue::String(s) if s.len() > 200 => println!("{k}: {:?}...", &s[..200]),
            _ => println!("{k}: {v:?}"),
        }
    }
    for t in f.tensors.iter().take(20) {
        println!(
            "{} {:?} {:?} off {} n {}",
            t.name, t.dims, t.ggml_type, t.offset, t.nbytes
        );
    }
    Ok(())
}
