"""Epoch accounting: how many passes over its corpus each rung of a study makes, checked at plan time.

A GPU rung trains on billions of tokens; the embedded corpus (~12 MB, for CPU studies) would repeat
hundreds of times and nothing in the loss says so. `epoch_rows` reads the token count from a
prepared corpus's manifest (`marin-ablate data prepare`) and `check_epochs` refuses, before anything
runs, a GPU rung on the embedded corpus, on a corpus of unknown size, or one that would repeat data
unless repetition is allowed explicitly (ALLOW_REPEAT), or a corpus whose per-rank loader index would not
fit the host (`check_loader_index`). Torch-free: the plan command runs it."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from marin_ablate.marin.data.index import read_index
from marin_ablate.marin.data.manifest import read_manifest, setting_path
from marin_ablate.marin.data.mixture import check_mixture_domains

#: Host memory one rank holds per document under DataConfig.shuffle="documents" (four int64 arrays, the uid
#: string, its sha256 key and the argsort; measured: 1.3 s / 337 MB at 10^6 documents, 20.2 s / 1,670 MB at
#: 1.2·10^7 opened as rank 0 of 704 -> ~150 bytes, benchmarks/RESULTS.md "Loader at web scale")
DOC_INDEX_BYTES = 150
#: What the train loader may hold per rank: a tenth of a GB200 tray's host memory per GPU (Marin's hero
#: requests 890 GB per 4-GPU worker: experiments/grug/moe_hero_ep/hero_recipe.py HERO_NODE_RAM)
HOST_LOADER_BUDGET_BYTES = 890 * 10**9 // 4 // 10
ALLOW_REPEAT = "--allow-repeat"  # the plan/run option that accepts more than one epoch on a GPU rung
CORPUS_SETTING = "--data.corpus=DIR"  # how a study points at a prepared corpus


def corpus_tokens(corpus: str) -> tuple[int | None, dict | None]:
    """(tokens, manifest) of a prepared corpus directory; (None, None) for anything without a
    manifest.json (the embedded corpus, a raw local directory, Paloma): their size in tokens is not
    known at plan time. A manifest that is unreadable or of another format is a ValueError."""
    if corpus == "embedded" or not (setting_path(corpus, "DataConfig.corpus") / "manifest.json").is_file():
        return None, None
    manifest = read_manifest(corpus)
    return int(manifest["tokens"]), manifest


def epoch_rows(rungs: Iterable[tuple]) -> list[dict]:
    """One row per rung from (rung, device, tokens needed by one run, model vocab, data.corpus[,
    DataConfig.simulated_epoching_target]): tokens needed, tokens in the corpus and epochs (None where
    the corpus size is unknown). Under simulated epoching a run reads a cut of run/target of each
    component round and round, so its epochs are those of the target budget: target / corpus tokens."""
    rows = []
    for name, device, tokens, vocab, corpus, *rest in rungs:
        target = rest[0] if rest else 0
        shuffle = rest[1] if len(rest) > 1 else "documents"
        have, manifest = corpus_tokens(corpus)
        rows.append({"rung": name, "device": device, "corpus": corpus, "tokens_needed": int(tokens),
                     "corpus_tokens": have, "epochs": ((target or tokens) / have) if have else None,
                     "simulated_epoching_target": target,
                     "corpus_vocab": manifest["tokenizer"]["vocab_size"] if manifest else None, "model_vocab": vocab,
                     "corpus_documents": int(manifest["documents"]) if manifest else None, "shuffle": shuffle})
    return rows


def check_loader_index(r: dict, budget: int = HOST_LOADER_BUDGET_BYTES) -> None:
    """ValueError naming the numbers when a rung's corpus cannot be opened by each rank within `budget`
    bytes of host memory (documents shuffle), or has no loader index (indexed shuffle)."""
    if r["corpus_documents"] is None:
        return
    if r["shuffle"] == "indexed":
        read_index(r["corpus"])  # ValueError naming `marin-ablate data index DIR`
        return
    need = r["corpus_documents"] * DOC_INDEX_BYTES
    if need > budget:
        raise ValueError(f"rung {r['rung']}: data.corpus={r['corpus']!r} holds {r['corpus_documents']:,} documents; "
                         f"DataConfig.shuffle='documents' holds ~{DOC_INDEX_BYTES} bytes per document on every rank, "
                         f"{need / 1e9:,.1f} GB against the loader's {budget / 1e9:,.1f} GB of host memory per rank; "
                         "allowed values: --data.shuffle=indexed (the index `data prepare` wrote: nothing per "
                         "document per rank) or a corpus of at most "
                         f"{budget // DOC_INDEX_BYTES:,} documents")


def check_epochs(rows: list[dict], allow_repeat: bool = False) -> None:
    """ValueError naming the setting when a rung's data is not fit for it (module docstring)."""
    for r in rows:
        check_loader_index(r)
        if r["corpus_vocab"] is not None and r["corpus_vocab"] > r["model_vocab"]:
            raise ValueError(f"rung {r['rung']}: data.corpus={r['corpus']!r} was tokenized with a vocabulary of "
                             f"{r['corpus_vocab']}, more than model.vocab_size={r['model_vocab']}; prepare it with "
                             "the model's tokenizer or raise model.vocab_size")
        if r["device"] != "cuda":
            continue
        if r["corpus"] == "embedded":
            raise ValueError(f"rung {r['rung']} trains {r['tokens_needed']:,} tokens on cuda but data.corpus="
                             "'embedded' is the small CPU test corpus; prepare a real corpus with `marin-ablate data "
                             f"prepare SOURCE --tokenizer PATH --corpus-dir DIR` and pass {CORPUS_SETTING}")
        if r["corpus_tokens"] is None:
            raise ValueError(f"rung {r['rung']}: data.corpus={r['corpus']!r} is not a prepared corpus, so its size "
                             "is unknown; prepare it with `marin-ablate data prepare` and pass " + CORPUS_SETTING)
        if r["epochs"] > 1.0 and not allow_repeat:
            raise ValueError(f"rung {r['rung']} needs {r['tokens_needed']:,} tokens but data.corpus={r['corpus']!r} "
                             f"holds {r['corpus_tokens']:,}: {r['epochs']:.2f} epochs would repeat data"
                             + (f" (simulated epoching to {r['simulated_epoching_target']:,} tokens)"
                                if r.get("simulated_epoching_target") else "") + "; use a larger "
                             f"corpus, or pass {ALLOW_REPEAT} to accept repetition")


def study_epoch_rows(rung_rows: list[dict], runs: list[tuple[Any, dict]]) -> list[dict]:
    """epoch_rows of a study's planned runs (spec, meta), one per rung; `rung_rows` is the study
    description's "rungs" (its per-run "tokens" when given, else steps x batch x seq_len)."""
    tokens = {r["name"]: r["tokens"] for r in rung_rows if "tokens" in r}
    seen: dict[str, tuple] = {}
    for spec, meta in runs:
        rung = meta["rung"]
        if rung not in seen:
            need = tokens.get(rung) or spec.train.steps * spec.train.batch_size * spec.model.seq_len
            seen[rung] = (rung, spec.train.device, need, spec.model.vocab_size, spec.data.corpus,
                          spec.data.simulated_epoching_target, spec.data.shuffle)
    return epoch_rows(seen.values())


def check_study_epochs(runs: Sequence[tuple[Any, dict]], rung_rows: list[dict],
                       allow_repeat: bool = False) -> list[dict]:
    """Per rung of a study's planned (spec, meta) (overrides applied): tokens needed, tokens in the corpus, epochs;
    ValueError when a rung's data is not fit for it (`check_epochs`) or a mixture names a domain its corpus lacks."""
    rows = study_epoch_rows(rung_rows, list(runs))
    check_epochs(rows, allow_repeat)
    for data in {sp.data for sp, _ in runs}:  # a mixture names the corpus's domains (before any run)
        check_mixture_domains(data)
    return rows
