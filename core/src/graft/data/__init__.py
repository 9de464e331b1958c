"""Data: the built-in tokenizer, synthetic tasks, JSONL/Parquet files, sampling."""
