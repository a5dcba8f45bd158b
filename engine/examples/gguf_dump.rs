//! Prints a GGUF file's metadata (long arrays and strings abbreviated) and tensor infos:
//! `cargo run -p dayone-engine --example gguf_dump -- FILE.gguf`.

use dayone_engine::loader::{GgufFile, MetaValue};

fn main() -> anyhow::Result<()> {
    let Some(path) = std::env::args().nth(1) else {
        anyhow::bail!("usage: gguf_dump FILE.gguf");
    };
    let f = GgufFile::open(std::path::Path::new(&path))?;
    println!(
        "GGUF v{}, alignment {}, data at byte {}, {} tensors",
        f.version,
        f.alignment,
        f.data_start,
        f.tensors.len()
    );
    for (k, v) in &f.metadata {
        match v {
            MetaValue::Array(a) => {
                println!("{k}: array[{}] {:?} ...", a.len(), &a[..a.len().min(8)])
            }
            MetaValue::String(s) if s.len() > 120 => {
                let cut: String = s.chars().take(120).collect();
                println!("{k}: {cut:?} ...")
            }
            _ => println!("{k}: {v:?}"),
        }
    }
    for t in &f.tensors {
        println!(
            "{} {:?} {} ({} bytes)",
            t.name,
            t.shape(),
            t.ggml_type.name(),
            t.nbytes
        );
    }
    Ok(())
}
