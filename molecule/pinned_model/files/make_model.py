"""A small model's files as a mirror holds them, seeded: config, tokenizer, 8 MiB of weights
in a subfolder. ``python make_model.py FOLDER SEED``."""

import hashlib
import json
import sys
from pathlib import Path

folder, seed = Path(sys.argv[1]), sys.argv[2]
(folder / "weights").mkdir(parents=True, exist_ok=True)
(folder / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
(folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "seed": seed}))
block = hashlib.sha256(seed.encode()).digest() * (1 << 15)  # 1 MiB
(folder / "weights" / "model.safetensors").write_bytes(block * 8)
