#!/usr/bin/env python3
"""Golden umT5 token ids from HF's tokenizer (what the reference uses) for tests/unit/test_prompt.cpp,
written to tests/data/tokenizer/umt5_golden.json.

The reference tokenizes with transformers.AutoTokenizer for google/umt5-xxl (T5TokenizerFast) called as
tokenizer(texts, return_tensors='pt', padding='max_length', truncation=True, max_length=512,
add_special_tokens=True) (groot/vla/model/dreamzero/transform/dreamzero_cotrain.py:38-89). dzr calls
libsentencepiece on spiece.model directly and appends EOS itself. This script records HF's ids for
texts that are already clean (the cleaning itself is tested separately), so the C++ test compares the
tokenizers alone. Each case stores the ids before padding ("ids"); the 512-long output is those ids, then pad 0, with
attention mask 1 exactly on them (asserted here). Cases marked "probe" exercise inputs where the two are expected to possibly differ
(special-token strings in the text, odd whitespace); the test reports them instead of failing.

Run where a local umt5-xxl tokenizer directory exists (spiece.model + tokenizer.json / config):
    python3 scripts/parity/gen_tokenizer_golden.py /path/to/umt5-xxl [--out PATH]
then run the C++ test with DZR_UMT5_TOKENIZER=/path/to/umt5-xxl/spiece.model.

Given a bare .model file instead of a directory, HF's T5 tokenizer is built from it (no extra ids);
that is how tests/data/tokenizer/hf_tiny_golden.json was made from the test model:
    python3 scripts/parity/gen_tokenizer_golden.py tests/data/tokenizer/spiece.model \
        --out tests/data/tokenizer/hf_tiny_golden.json
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import transformers
from transformers import AutoTokenizer

NEGATIVE = ("Vibrant colors, overexposed, static, blurry details, text, subtitles, style, artwork, painting, image, "
            "still, grayscale, dull, worst quality, low quality, JPEG artifacts, ugly, mutilated, extra fingers, bad "
            "hands, bad face, deformed, disfigured, mutated limbs, fused fingers, stagnant image, cluttered background, "
            "three legs, many people in the background, walking backwards.")


def droid_template(instruction):
    p = instruction.lower()
    return ("A multi-view video shows that a robot " + p + " The video is split into three views: The top view shows "
            "the camera view from the robot's wrist, the bottom-left view shows the camera view from the left exterior "
            "camera, and the bottom-right view shows the camera view from the right exterior camera. During training, "
            "one of the two bottom exterior views may be a black screen (dropped view). The robot " + p)


CASES = [
    (droid_template("pick up the red cup and place it in the sink"), False),
    (droid_template("put the marker in the blue bowl"), False),
    (droid_template("open the top drawer, then close it."), False),
    (NEGATIVE, False),
    ("pick up the red cup", False),
    ("Move the banana 10 cm to the left (slowly)!", False),
    ("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e", False),
    ("robot's gripper: 2026, 3.14, #1", False),
    (" ".join(["stack the green block on the yellow block"] * 80), False),  # > 512 tokens: truncation
    ("  leading and trailing spaces  ", True),
    ("double  space and\ttab", True),
    ("end of text </s> in the middle", True),
    ("a sentinel <extra_id_0> marker", True),
    ("\uff21\uff22\uff23 full width", True),
    ("", True),
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "tokenizer", "umt5_golden.json"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tokenizer_dir")
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args()

    if os.path.isfile(args.tokenizer_dir):
        # a bare sentencepiece model: give HF the T5 configuration next to it
        tmp = tempfile.mkdtemp()
        shutil.copy(args.tokenizer_dir, os.path.join(tmp, "spiece.model"))
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "eos_token": "</s>", "pad_token": "<pad>",
                       "unk_token": "<unk>", "model_max_length": 512}, f)
        tok = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
    else:
        tok = AutoTokenizer.from_pretrained(args.tokenizer_dir, local_files_only=True)
    cases = []
    for text, probe in CASES:
        enc = tok([text], return_tensors="pt", padding="max_length", truncation=True, max_length=512,
                  add_special_tokens=True)
        ids, mask = enc.input_ids[0].tolist(), enc.attention_mask[0].tolist()
        n = sum(mask)
        # stored compactly: the unpadded ids; the file format says the rest is pad 0 with mask 0
        assert len(ids) == 512 and mask == [1] * n + [0] * (512 - n) and all(v == 0 for v in ids[n:])
        cases.append({"text": text, "probe": probe, "ids": ids[:n]})
    golden = {"generator": "scripts/parity/gen_tokenizer_golden.py", "tokenizer": type(tok).__name__,
              "tokenizer_dir": os.path.basename(os.path.normpath(args.tokenizer_dir)),
              "transformers": transformers.__version__, "cases": cases}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
    os.replace(tmp, args.out)
    print(f"wrote {args.out}: {len(cases)} cases with {golden['tokenizer']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
