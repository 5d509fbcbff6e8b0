"""docs/data.md "Running on real data": its code block runs verbatim offline in a fresh folder (a corpus
of local text files, a BPE tokenizer trained on it, a verified corpus, a short training run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _real_data_block() -> str:
    text = (ROOT / "docs" / "data.md").read_text()
    section = text.split("## Running on real data", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section has one bash block: the steps this test runs"
    return blocks[0]


@pytest.mark.slow
def test_readme_real_data_steps_run_verbatim_offline(tmp_path):
    env = {**os.environ, "MARIN_DATA_DIR": str(tmp_path / "cache"), "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", _real_data_block()], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "shards done" in r.stdout and "match manifest.json (sha256)" in r.stdout  # progress and verify
    m = json.loads((tmp_path / "prepared" / "manifest.json").read_text())
    assert m["tokenizer"]["vocab_size"] == 2048 and (tmp_path / "prepared" / "tokenizer.json").is_file()
    assert set(m["domains"]) == {"code", "docs"}
    summary = json.loads((tmp_path / "runs" / "real" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert set(summary["eval_domain_loss"]) == {"code", "docs"}
