"""Where tensors come from: stores (local folder, Hub repo), safetensors headers, the catalogue."""
