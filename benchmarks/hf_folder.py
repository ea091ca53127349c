"""A GPT-2-small-sized HuggingFace folder for the loading and generation benchmarks: random
weights (``transformers``' own init, seed 0) saved by ``save_pretrained`` (498 MB of float32
safetensors) and a small byte-level BPE tokenizer trained here by ``tokenizers``; made once per
benchmark run in a temporary folder, nothing downloaded.  ``child(code)`` runs a measuring snippet
in a fresh process (its own imports included) and returns the JSON it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpt2_small_folder(path: str | None = None) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = Path(path or tempfile.mkdtemp(prefix="gpt2-small-"))
    if (folder / "model.safetensors").is_file():
        return folder
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    model.save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(["the cat sat on the mat; the dog sat on the log."] * 50, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                         eos_token="<|endoftext|>").save_pretrained(folder)
    return folder


def child(code: str, env: dict | None = None, timeout: int = 1800) -> dict:
    """Run ``code`` in a fresh Python (this repository importable) and parse the JSON object on
    the last line it prints."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, cwd=str(ROOT))
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_mb() -> float:
    """This process's peak resident memory in MB (``VmHWM``: unlike ``ru_maxrss``, which Linux
    carries over ``exec`` from the parent process, it starts afresh in a new program)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
