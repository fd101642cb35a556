"""DAPO-shaped parquet files and tiny Hugging Face model directories for the prepare and doctor tests.

The parquet has the published file's nested columns, a duplicated ``extra_info.index`` whose second
copy differs (the first must win) and non-ASCII text (it must stay unescaped in the JSONL).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PROMPT_TYPE = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
REWARD_TYPE = pa.struct([("ground_truth", pa.string()), ("style", pa.string())])
EXTRA_TYPE = pa.struct([("index", pa.string())])


def rows():
    return [
        {"data_source": "math_dapo", "prompt": [{"content": "Solve 1+1.", "role": "user"}], "ability": "MATH",
         "reward_model": {"ground_truth": "2", "style": "rule-lighteval/MATH_v2"}, "extra_info": {"index": "a-1"}},
        {"data_source": "math_dapo", "prompt": [{"content": "Évaluez ∫₀¹ x² dx — 数学 🚀", "role": "user"}],
         "ability": "MATH", "reward_model": {"ground_truth": "1/3", "style": "rule"},
         "extra_info": {"index": "b-2"}},
        # a duplicate of a-1 with different text: the first occurrence must win
        {"data_source": "other", "prompt": [{"content": "DUPLICATE", "role": "user"}], "ability": "MATH",
         "reward_model": {"ground_truth": "999", "style": "rule"}, "extra_info": {"index": "a-1"}},
        {"data_source": "math_dapo", "prompt": [{"content": "Say \"hi\"\n", "role": "user"}], "ability": "MATH",
         "reward_model": {"ground_truth": "hi", "style": None}, "extra_info": {"index": "c-3"}},
    ]


def write_parquet(path: Path, data=None, *, drop: str | None = None) -> Path:
    data = rows() if data is None else data
    columns = {
        "data_source": pa.array([r["data_source"] for r in data], pa.string()),
        "prompt": pa.array([r["prompt"] for r in data], PROMPT_TYPE),
        "ability": pa.array([r["ability"] for r in data], pa.string()),
        "reward_model": pa.array([r["reward_model"] for r in data], REWARD_TYPE),
        "extra_info": pa.array([r["extra_info"] for r in data], EXTRA_TYPE),
    }
    if drop:
        del columns[drop]
    pq.write_table(pa.table(columns), path)
    return path


# The exact bytes, written out by hand: key order, compact separators, non-ASCII kept, first a-1 kept.
EXPECTED_JSONL = (
    '{"prompt":[{"content":"Solve 1+1.","role":"user"}],"label":"2","data_source":"math_dapo",'
    '"ability":"MATH","source_index":"a-1","reward_style":"rule-lighteval/MATH_v2"}\n'
    '{"prompt":[{"content":"Évaluez ∫₀¹ x² dx — 数学 🚀","role":"user"}],"label":"1/3",'
    '"data_source":"math_dapo","ability":"MATH","source_index":"b-2","reward_style":"rule"}\n'
    '{"prompt":[{"content":"Say \\"hi\\"\\n","role":"user"}],"label":"hi","data_source":"math_dapo",'
    '"ability":"MATH","source_index":"c-3","reward_style":null}\n'
)


def make_model(root: Path, weights: bool = True) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "qwen3"}')
    (root / "tokenizer.json").write_text('{"vocab": {"a": 0}}')
    if weights:
        (root / "model-00001-of-00002.safetensors").write_bytes(os.urandom(4096))
        (root / "model-00002-of-00002.safetensors").write_bytes(os.urandom(1000))
    return root
