"""The data-mixture schedule (marin/data/mixture.py, DataConfig.mixture): phases of domain weights over
per-domain streams, exact by (seed, step) for resume and ranks; checked against the sequential
highest-averages rule and against each domain's documents read in the corpus's own sha256 order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marin_ablate.marin import data
from marin_ablate.marin.config import DataConfig, RunSpec, TrainConfig
from marin_ablate.marin.data.corpus import hash_hex
from marin_ablate.marin.data.mixture import MixturePlan, webster
from marin_ablate.marin.data.shards import PreparedCorpus, ShardedBatches
from marin_ablate.marin.presets import preset

SEQ, G, SEED, STEPS = 32, 8, 3, 10
MIX = ((0.0, {"prose": 3.0, "code": 1.0}), (0.6, {"docs": 1.0, "scripture": 1.0, "code": 2.0}))


def _sequential(n: int, w: list[float]) -> np.ndarray:
    """Independent reference: award n seats one at a time to the largest w_d / (s_d + 1/2)."""
    w_D, s_D = np.asarray(w, float) / sum(w), np.zeros(len(w), int)
    for _ in range(n):
        s_D[int(np.argmax(np.where(w_D > 0, w_D / (s_D + 0.5), -np.inf)))] += 1
    return s_D


@pytest.fixture(scope="module")
def corpus() -> PreparedCorpus:
    return PreparedCorpus(data.prepared_train(DataConfig()))


def _loader(corpus, rank=0, world=1, mixture=MIX, steps=STEPS, seed=SEED) -> ShardedBatches:
    return ShardedBatches(corpus, SEQ, G, seed, rank=rank, world=world, mixture=DataConfig(mixture=mixture).mixture,
                          total_steps=steps)


def _domain_stream(corpus: PreparedCorpus, domain: str, seed: int) -> np.ndarray:
    """Reference: the domain's documents in sha256(seed:0:uid) order (epoch 0), concatenated."""
    uids = corpus.uids
    mine = [j for j, u in enumerate(uids) if u.split("/")[0] == domain]
    mine.sort(key=lambda j: int(hash_hex(f"{seed}:0:{uids[j]}")[:15], 16))
    return np.concatenate([corpus.doc(j) for j in mine])


@pytest.mark.parametrize("mixture, message", [
    (((0.2, {"code": 1}),), r"first phase starts at start_frac=0.2; allowed values: 0"),
    (((0, {"code": 1}), (0.5, {"code": 1}), (0.5, {"docs": 1})), r"strictly increasing"),
    (((0, {"code": 1}), (1.0, {"docs": 1})), r"in \[0, 1\)"),
    (((0, {"code": -1.0}),), r"weight of 'code' is -1.0; allowed values: a finite number >= 0"),
    (((0, {"code": 0.0, "docs": 0.0}),), r"sum to 0"),
    (((0, {}),), r"non-empty"),
    ("0:code", r"does not parse; allowed values: FRAC:DOMAIN=WEIGHT"),
])
def test_a_bad_mixture_is_one_line_naming_the_field_and_the_allowed_values(mixture, message):
    with pytest.raises(ValueError, match=r"^DataConfig\.mixture: .*" + message):
        DataConfig(mixture=mixture)


def test_a_domain_the_corpus_lacks_is_refused_before_any_step(corpus):
    from marin_ablate.marin.train.source import validate_data

    bad = DataConfig(mixture=((0, {"code": 1, "web": 1}),))
    with pytest.raises(ValueError, match=r"DataConfig\.mixture names domain\(s\) \['web'\].*allowed values: 'prose'"):
        validate_data(bad)
    with pytest.raises(ValueError, match=r"DataConfig\.mixture: phase 0 names domain 'web'.*allowed values"):
        _loader(corpus, mixture=bad.mixture)


def test_the_set_string_form_and_the_mapping_form_are_one_spec():
    a = DataConfig(mixture="0:prose=3+code=1,0.6:docs=1+scripture=1+code=2")
    assert a == DataConfig(mixture=MIX)
    assert RunSpec.from_dict(RunSpec(data=a).to_dict()).data == a
    assert RunSpec(data=a).run_id != RunSpec().run_id
    assert "mixture" not in RunSpec().identity_json()  # no mixture: every existing run keeps its id
    with pytest.raises(ValueError, match=r"^DataConfig\.mixture_block"):
        DataConfig(mixture_block=-1)


def test_webster_counts_are_the_sequential_rule_so_a_steps_count_is_never_negative():
    rng = np.random.default_rng(0)
    for _ in range(15):
        w = (rng.random(4) * (rng.random(4) > 0.3)).tolist()
        w = w if sum(w) > 0 else [1.0, 0, 0, 0]
        prev = np.zeros(4, int)
        for n in range(0, 60):
            got = webster(n, np.array(w))
            np.testing.assert_array_equal(got, _sequential(n, w))
            assert got.sum() == n and (got >= prev).all()
            prev = got


def test_each_phase_reads_its_proportions_from_each_domains_own_stream_in_order(corpus):
    loader = _loader(corpus)
    names, _ = corpus.doc_domains()
    assert loader.plan.start_P.tolist() == [0, 6]  # floor(0.6 * 10)
    refs = {d: _domain_stream(corpus, d, SEED) for d in names}
    read = {d: 0 for d in names}  # sequences of each domain read so far
    before = dict(read)  # ... when the phase began
    for step in range(STEPS):
        tokens, targets, _ = loader.batch(step)
        dom = [names[i] for i in loader.row_domains(step)]
        for row, d in zip(tokens.numpy(), dom, strict=True):
            k = read[d]
            np.testing.assert_array_equal(row, refs[d][k * SEQ:(k + 1) * SEQ])  # next window of its own stream
            read[d] += 1
        if step in (5, 9):  # end of each phase: the counts are the apportionment of the phase's sequences
            phase = MIX[0 if step == 5 else 1][1]
            n = (6 if step == 5 else 4) * G
            want = _sequential(n, list(phase.values()))
            got = [read[d] - before[d] for d in phase]
            assert got == want.tolist()
            before = dict(read)


def test_resume_mid_phase_and_across_the_switch_reads_the_uninterrupted_batches(corpus):
    full = _loader(corpus)
    ref = [full.batch(s)[0].tolist() for s in range(STEPS)]
    for cut in (3, 5, 6):  # mid phase 0, the last step before the switch, the first after
        first = _loader(corpus)
        for _ in range(cut):
            next(first)
        resumed = _loader(corpus)
        resumed.load_state_dict(first.state_dict())
        assert [next(resumed)[0].tolist() for _ in range(cut, STEPS)] == ref[cut:]
    with pytest.raises(ValueError, match="loader state mixture"):
        _loader(corpus, mixture=((0, {"code": 1}),)).load_state_dict(full.state_dict())
    with pytest.raises(ValueError, match="loader state total_steps"):
        _loader(corpus, steps=20).load_state_dict(full.state_dict())


def test_two_ranks_read_disjoint_halves_of_the_same_global_batch(corpus):
    one = _loader(corpus)
    r0, r1 = _loader(corpus, 0, 2), _loader(corpus, 1, 2)
    for step in (0, 5, 6, 9):
        whole = one.batch(step)
        halves = [r.batch(step) for r in (r0, r1)]
        for i in range(3):
            assert halves[0][i].tolist() + halves[1][i].tolist() == whole[i].tolist()


def test_without_a_mixture_the_loader_reads_the_corpus_stream_unchanged(corpus):
    plain = ShardedBatches(corpus, SEQ, G, SEED, rank=0, world=1)
    stream = np.concatenate([corpus.doc(j) for j in plain.order(0)])
    assert plain.plan is None and "mixture" not in plain.state_dict()
    np.testing.assert_array_equal(plain.batch(2)[0].numpy().ravel(), stream[2 * G * SEQ:3 * G * SEQ])


def _which_domain(row: np.ndarray, refs: dict[str, bytes]) -> list[str]:
    """Every domain whose stream contains this row (uint16 tokens, matched at an even byte offset)."""
    needle = row.astype(np.uint16).tobytes()
    out = []
    for d, hay in refs.items():
        at = hay.find(needle)
        while at != -1 and at % 2:
            at = hay.find(needle, at + 1)
        if at != -1:
            out.append(d)
    return out


@pytest.mark.slow
def test_a_tiny_run_trains_on_each_phases_domain_fractions(corpus, tmp_path, monkeypatch):
    from marin_ablate.marin.train import train

    seen: list = []
    real = ShardedBatches.batch

    def spy(self, step):  # what the trainer was given, nothing else
        out = real(self, step)
        seen.append((step, out[0].numpy().copy()))
        return out

    monkeypatch.setattr(ShardedBatches, "batch", spy)
    spec = RunSpec(model=preset("tiny", [f"seq_len={SEQ}"]),
                   train=TrainConfig(steps=STEPS, batch_size=G, eval_every=0, eval_batches=1, log_every=1,
                                     checkpoint_every=0, threads=1),
                   data=DataConfig(mixture=MIX, data_seed=SEED))
    summary = train(spec, tmp_path / "run")
    assert summary["status"] == "completed" and [s for s, _ in seen] == list(range(STEPS))
    refs = {d: _domain_stream(corpus, d, SEED).astype(np.uint16).tobytes()
            for d in ("prose", "code", "docs", "scripture")}
    tokens = {0: {}, 1: {}}
    for step, rows in seen:
        phase = 0 if step < 6 else 1
        for row in rows:
            hits = _which_domain(row, refs)
            assert len(hits) == 1, hits  # each consumed sequence comes from exactly one domain's text
            tokens[phase][hits[0]] = tokens[phase].get(hits[0], 0) + len(row)
    for phase, (_, weights) in enumerate(MIX):
        total = sum(tokens[phase].values())
        assert set(tokens[phase]) == set(weights)
        for d, w in weights.items():  # measured token fractions: the phase's weights to within one sequence
            assert tokens[phase][d] / total == pytest.approx(w / sum(weights.values()), abs=SEQ / total)


def test_hero_ladder_and_hero_study_switch_to_the_cooldown_mix_at_80_percent_of_the_steps():
    from marin_ablate.ablations.ladders import HERO_MIXTURE, HERO_RUNGS
    from marin_ablate.ablations.studies import get_study

    assert [p.start_frac for p in HERO_MIXTURE] == [0.0, 0.8]
    assert {d for p in HERO_MIXTURE for d, _ in p.weights} == {"prose", "scripture", "docs", "code"}
    assert dict(HERO_MIXTURE[0].weights) == {"code": 1.0, "docs": 1.0, "prose": 1.0, "scripture": 1.0}
    assert dict(HERO_MIXTURE[1].weights) == {"code": 2.0, "docs": 2.0, "prose": 1.0, "scripture": 1.0}
    study = get_study("marin535", rungs=tuple(HERO_RUNGS))
    switch = {}
    for spec, meta in study.runs():
        assert spec.data.mixture == HERO_MIXTURE and spec.data.mixture_block == 49_152, meta["rung"]
        plan = MixturePlan(spec.data.mixture, ["prose", "scripture", "docs", "code"], spec.train.effective().steps,
                           spec.train.batch_size, 0, block=spec.data.mixture_block)
        switch[meta["rung"]] = plan.start_P.tolist()
    # Marin's rule by hand: int(0.8 x steps) rounded down to a multiple of 49,152 / gcd(49,152, batch)
    # steps; d768: int(9,136.0) -> multiple of 48 -> 9,120; d1536 (batch 6,144): int(12,102.4) -> of 8 -> 12,096;
    # d512 (3,930 steps): int(3,144.0) -> of 48 -> 3,120
    assert switch == {"hero_d512": [0, 3120], "hero_d768": [0, 9120], "hero_d1024": [0, 12216],
                      "hero_d1536": [0, 12096], "hero_d2048": [0, 16032]}
    hero = get_study("hero").runs()[0][0]
    assert hero.data.mixture == HERO_MIXTURE
    plan = MixturePlan(hero.data.mixture, ["prose", "scripture", "docs", "code"], hero.train.steps,
                       hero.train.batch_size, 0, block=hero.data.mixture_block)
    assert plan.start_P.tolist() == [0, 312_192]  # int(312,200.8) rounded down to a multiple of 48
    # a tiny run on a block: the switch is at least one block multiple
    assert MixturePlan(HERO_MIXTURE, ["prose", "scripture", "docs", "code"], 10, 1024, 0,
                       block=49_152).start_P.tolist() == [0, 48]
    assert get_study("hero", corpus=str(Path(data.prepared_train(DataConfig())))).runs()[0][0].data.mixture == ()
    from dataclasses import replace

    own = DataConfig(mixture=((0.0, {"code": 1.0}),))
    assert replace(study, data=own).runs()[0][0].data.mixture == own.mixture  # the study's own mixture wins
    other = DataConfig(corpus=str(Path(data.prepared_train(DataConfig()))))
    assert replace(study, data=other).runs()[0][0].data.mixture == ()  # not the embedded corpus: its own data
    # every other study keeps one stream (and its run ids)
    assert all(s.data.mixture == () for s, _ in get_study("smoke").runs())


def test_plan_refuses_a_mixture_naming_a_domain_the_corpus_lacks_before_any_run(capsys):
    from marin_ablate.cli.main import main

    assert main(["plan", "smoke", "--data.mixture=0:prose=1+web=1,0.8:code=1"]) == 2
    err = capsys.readouterr().err
    assert "DataConfig.mixture names domain(s) ['web']" in err and "allowed values: 'prose'" in err
    assert main(["plan", "smoke", "--data.mixture=0:prose=1+code=1,0.8:docs=1"]) == 0
