"""The language model: resolution, loading, batched and prefix-cached scoring, ICL prompts, the server."""
