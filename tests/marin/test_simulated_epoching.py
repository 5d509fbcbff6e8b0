"""Simulated epoching (DataConfig.simulated_epoching_target; levanter LmDataConfig experiment_budget /
target_budget): each component is cut to its first int(n · run tokens / target) sequences and read round
and round. Checked against the rule computed here from the corpus's own document lengths, against each
domain's documents read in the corpus's sha256 order, and by a real run resumed across a cut's wrap."""

from __future__ import annotations

import numpy as np
import pytest

from marin_ablate.marin import data
from marin_ablate.marin.config import DataConfig, RunSpec, TrainConfig
from marin_ablate.marin.data.corpus import hash_hex
from marin_ablate.marin.data.shards import PreparedCorpus, ShardedBatches, simulated_length
from marin_ablate.marin.presets import preset

SEQ, G, SEED, STEPS = 32, 8, 3, 10
MIX = ((0.0, {"prose": 3.0, "code": 1.0}), (0.6, {"docs": 1.0, "scripture": 1.0, "code": 2.0}))
RUN = STEPS * G * SEQ  # the experiment budget: 2,560 tokens
TARGET = 30_000_000  # ratio 8.53e-5: the embedded domains (~63k-95k sequences of 32) cut to 5-8 sequences


@pytest.fixture(scope="module")
def corpus() -> PreparedCorpus:
    return PreparedCorpus(data.prepared_train(DataConfig()))


def _domain_stream(corpus: PreparedCorpus, domain: str, seed: int) -> np.ndarray:
    """Reference: the domain's documents in sha256(seed:0:uid) order (epoch 0), concatenated."""
    uids = corpus.uids
    mine = [j for j, u in enumerate(uids) if u.split("/")[0] == domain]
    mine.sort(key=lambda j: int(hash_hex(f"{seed}:0:{uids[j]}")[:15], 16))
    return np.concatenate([corpus.doc(j) for j in mine])


def _cut(corpus, mixture=MIX, target=TARGET, steps=STEPS) -> ShardedBatches:
    return ShardedBatches(corpus, SEQ, G, SEED, rank=0, world=1, mixture=DataConfig(mixture=mixture).mixture,
                          total_steps=steps, simulated_target=target)


def test_each_domain_is_cut_to_int_n_times_run_over_target_sequences_and_repeats_them_in_order(corpus):
    loader = _cut(corpus)
    names, dom_N = corpus.doc_domains()
    # the rule by hand, in exact integers: n = the domain's tokens // seq_len (levanter's packed length),
    # L = floor(n · run / target); the numbers are far from a rounding edge, so float and exact agree
    n = {d: int(corpus.doc_lengths[dom_N == i].sum()) // SEQ for i, d in enumerate(names)}
    want = {d: n[d] * RUN // TARGET for d in names}
    assert dict(zip(names, loader.domain_lengths, strict=True)) == want
    assert want == {"code": 8, "docs": 8, "prose": 5, "scripture": 8}
    assert simulated_length(63_666, RUN, TARGET) == int(63_666 * (RUN / TARGET)) == 5  # Marin's float form
    refs = {d: _domain_stream(corpus, d, SEED) for d in names}
    read = {d: 0 for d in names}
    for step in range(STEPS):
        tokens, _, _ = loader.batch(step)
        for row, d in zip(tokens.numpy(), [names[i] for i in loader.row_domains(step)], strict=True):
            k = read[d] % want[d]  # the k-th sequence of the cut, round and round
            np.testing.assert_array_equal(row, refs[d][k * SEQ:(k + 1) * SEQ])
            read[d] += 1
    assert read["prose"] == 36 and read["prose"] > 7 * want["prose"]  # prose repeats seven times and more


def test_without_a_mixture_the_corpus_stream_is_the_one_component_cut(corpus):
    loader = ShardedBatches(corpus, SEQ, G, SEED, rank=0, world=1, total_steps=STEPS, simulated_target=4 * 10 ** 7)
    n = corpus.n_tokens // SEQ
    assert loader.length == n * RUN // (4 * 10 ** 7) == 22
    stream = np.concatenate([corpus.doc(j) for j in loader.order(0)])
    rows = np.concatenate([loader.batch(s)[0].numpy() for s in range(STEPS)])  # 80 sequences of a 22-cut
    for j, row in enumerate(rows):
        k = j % 22
        np.testing.assert_array_equal(row, stream[k * SEQ:(k + 1) * SEQ])
    state = loader.state_dict()
    assert state["simulated_target"] == 4 * 10 ** 7 and state["simulated_lengths"] == [22]
    plain = ShardedBatches(corpus, SEQ, G, SEED, rank=0, world=1)
    assert "simulated_target" not in plain.state_dict()  # off: the state (and old checkpoints) unchanged
    with pytest.raises(ValueError, match="loader state simulated_target"):
        plain.load_state_dict(state)


def test_bad_simulated_epoching_targets_are_refused_with_the_field_and_the_allowed_values(corpus):
    with pytest.raises(ValueError, match=r"DataConfig.simulated_epoching_target.*an integer >= 0"):
        DataConfig(simulated_epoching_target=-1)
    with pytest.raises(ValueError, match=r"simulated_epoching_target=2000 is below this run's 2560 tokens.*"
                                         r"allowed values: 0 \(off\) or at least the run's tokens"):
        _cut(corpus, target=2000)
    with pytest.raises(ValueError, match=r"domain 'prose' .* is cut to 0 sequences .*allowed values: 0 \(off\)"):
        _cut(corpus, target=RUN * 70_000)
    assert DataConfig().simulated_epoching_target == 0


def test_the_hero_ladder_rungs_simulate_the_heros_budget_and_nothing_else_does():
    from marin_ablate.ablations.ladders import CPU_RUNGS, GPU_RUNGS, HERO_RUNGS
    from marin_ablate.ablations.studies import get_study

    # Marin: every rung below the d6144 hero (<= 1e23 FLOPs) cuts to the hero mixture's 15T + 3.75T
    specs = [s for s, _ in get_study("marin535", rungs=tuple(HERO_RUNGS)).runs()]
    assert {s.data.simulated_epoching_target for s in specs} == {18_750_000_000_000}
    assert all(r.simulated_epoching_target == 0 for r in (*CPU_RUNGS.values(), *GPU_RUNGS.values()))
    for study in ("smoke", "overtrain", "hero"):  # the hero trains on the raw mixture (2.7e24 FLOPs)
        assert all(s.data.simulated_epoching_target == 0 for s, _ in get_study(study).runs()), study


@pytest.mark.slow  # three real runs
def test_a_real_run_resumed_across_a_wrap_of_the_cut_equals_the_uninterrupted_run(tmp_path, corpus):
    from marin_ablate.marin.train import train

    # no mixture: the corpus is one component of n = tokens // 64 sequences, cut to
    # int(n · 3,072 / 13.2M) = 40 (the rule by hand below); steps 0-5 read sequences 0..35 and step 6
    # reads 36..39 then wraps to 0, 1: the run is checkpointed before step 6 and resumed across the wrap
    target = 13_200_000
    n = corpus.n_tokens // 64
    assert n * 3072 // target == 40
    spec = RunSpec(model=preset("tiny", ["seq_len=64"]),
                   train=TrainConfig(steps=8, batch_size=6, eval_every=0, eval_batches=1, log_every=1,
                                     checkpoint_every=0, threads=1),
                   data=DataConfig(simulated_epoching_target=target))
    ref = train(spec, tmp_path / "ref")
    assert ref["data"]["simulated_epoch_sequences"] == {"64": [40]}
    run = tmp_path / "cut"
    first = train(spec, run, stop_after=6)
    assert first["status"] == "interrupted" and first["step"] == 6
    resumed = train(spec, run)
    assert resumed["status"] == "completed" and resumed["resumed_from"]
    assert resumed["loss_curve"] == ref["loss_curve"] and resumed["final_train_loss"] == ref["final_train_loss"]
    assert len(ref["loss_curve"]) == 8


def test_plan_counts_a_simulated_runs_epochs_as_its_targets_over_the_corpus(corpus):
    from marin_ablate.ablations.epochs import check_epochs, epoch_rows

    where = str(data.prepared_train(DataConfig()))
    plain, cut = epoch_rows([("r", "cuda", 10 ** 6, 256, where), ("r", "cuda", 10 ** 6, 256, where, 10 ** 9)])
    assert plain["epochs"] == 10 ** 6 / corpus.n_tokens < 1  # the run alone would not repeat the corpus
    # with the cut it reads run/target of each component target/run times: the target's epochs
    assert cut["epochs"] == 10 ** 9 / corpus.n_tokens > 1
    check_epochs([plain])
    with pytest.raises(ValueError, match=r"epochs would repeat data \(simulated epoching to 1,000,000,000 tokens\)"):
        check_epochs([cut])
    check_epochs([cut], allow_repeat=True)
