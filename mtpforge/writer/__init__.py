"""Writing: streamed safetensors files and atomic folder updates."""
