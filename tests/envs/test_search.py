"""toolgym/Search-v0: the world, the questions, the retriever, the env and the loaders."""

import json

import gymnasium as gym
import numpy as np
import pytest

import toolgym  # noqa: F401
from toolgym.envs.search.corpus import load_questions
from toolgym.envs.search.expert import extract, parse_results
from toolgym.envs.search.kb import World
from toolgym.envs.search.questions import KINDS_BY_HOPS, QuestionMaker
from toolgym.envs.search.retriever import BM25Index
from toolgym.envs.search.sources import world, world_retriever
from toolgym.errors import ConfigError

ENV = "toolgym/Search-v0"


def _play_expert(env, seed):
    env.reset(seed=seed)
    inner = env.unwrapped
    for _ in range(inner.max_turns):
        _obs, _reward, term, trunc, info = env.step(inner.expert_action())
        if term or trunc:
            return info
    raise AssertionError("the episode did not end")


def test_world_is_seeded_and_names_are_unique():
    a, b, c = World(3, 2000), World(3, 2000), World(4, 2000)
    assert list(a.passages()) == list(b.passages())
    assert list(a.passages()) != list(c.passages())
    for names in (a.person_names, a.city_names, a.org_names, a.work_titles, a.country_names):
        assert len(set(names)) == len(names)
    titles = [t for t, _ in a.passages(0, len(a) - a.n_distractor)]
    assert len(set(titles)) == len(titles)  # every entity has one passage under its own name
    with pytest.raises(ConfigError):
        World(0, 10)


def test_large_world_is_fast_and_streams():
    import time

    start = time.perf_counter()
    w = World(0, 1_000_000)
    first = next(w.passages(500_000))
    assert first == w.passage(500_000)
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("hops", [1, 2, 3, 4])
def test_every_kind_of_question_is_drawn_with_its_hops(hops):
    maker = QuestionMaker(world(0, 10_000))
    rng = np.random.default_rng(hops)
    for kind in KINDS_BY_HOPS[hops]:
        q = maker.make(rng, hops, kind)
        assert q.hops == hops and q.kind == kind and q.answers
        if kind != "comparison":  # a comparison names both candidates
            assert not any(a.lower() in q.text.lower() for a in q.answers if len(a) > 4)
        follows = sum(step["op"] == "follow" for step in q.plan)
        assert follows == hops  # one passage read per hop
    with pytest.raises(ConfigError):
        maker.make(rng, hops, "nope")


@pytest.mark.parametrize("hops", [1, 2, 3, 4])
def test_expert_follows_the_hops(hops):
    env = gym.make(ENV, hops=hops)
    wins = sum(_play_expert(env, seed)["success"] for seed in range(200))
    assert wins / 200 >= 0.95


def test_random_query_policy_scores_near_zero():
    env = gym.make(ENV)
    inner = env.unwrapped
    rng = np.random.default_rng(0)
    vocab = [w for w in inner.source.retriever.index.vocab if w.isalpha()]
    wins = 0
    for seed in range(100):
        env.reset(seed=seed)
        query = " ".join(rng.choice(vocab, size=3))
        obs, *_ = env.step(
            f'<tool_call>{{"name": "search", "arguments": {{"query": "{query}"}}}}</tool_call>'
        )
        results = parse_results(obs[0]["content"])
        guess = results[0][0] if results else "unknown"
        *_, info = env.step(f"<answer>{guess}</answer>")
        wins += info["success"]
    assert wins / 100 <= 0.05


def test_fast_topk_equals_bm25s_retrieve():
    import bm25s

    retriever = world_retriever(world(0, 10_000))
    index = retriever.index
    queries = [
        "Gramyst College",
        "capital",
        "university founded",
        "born in Port",
        "The Glass Meridian",
        "zzqx",
    ]
    queries += [retriever.store.get(i).title for i in range(0, 10_000, 997)]
    maker, rng = QuestionMaker(world(0, 10_000)), np.random.default_rng(5)
    queries += [maker.make(rng, 1 + i % 4).text for i in range(60)]  # rare and common terms: MaxScore prunes
    for q in queries:
        docs, scores = index.search(q, 10)
        ids = index.tokens(q)
        if not ids:
            assert len(docs) == 0
            continue
        ref_docs, ref_scores = index.model.retrieve([ids], k=10, show_progress=False)
        ref = {int(d): float(s) for d, s in zip(ref_docs[0], ref_scores[0], strict=True) if s > 0}
        np.testing.assert_allclose(scores, sorted(ref.values(), reverse=True)[: len(scores)], rtol=1e-5)
        assert isinstance(bm25s.BM25, type)


def test_index_cache_roundtrip(tmp_path):
    texts = ["alpha beta", "beta gamma delta", "gamma"]
    built = BM25Index.build(texts, show_progress=False)
    built.save(tmp_path / "ix")
    loaded = BM25Index.load(tmp_path / "ix")
    assert loaded.search("gamma", 2)[0].tolist() == built.search("gamma", 2)[0].tolist()
    with pytest.raises(ConfigError):
        BM25Index.load(tmp_path)


def test_episode_flow_rewards_and_gold_only_in_info():
    env = gym.make(ENV, hops=2, reward="f1", format_bonus=0.1)
    obs, info = env.reset(seed=7)
    gold = info["gold"]
    assert gold and info["hops"] == 2
    assert not any(g in m["content"] for m in obs for g in gold)
    inner = env.unwrapped
    obs, reward, term, _trunc, info = env.step(inner.expert_action())
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Doc 1(Title: ")
    assert reward == 0.0 and not term and info["gold"] == gold
    *_, info = _finish(env)
    assert info["success"] and info["episode_reward_components"] == pytest.approx(
        {"correct": 1.0, "format": 0.1}
    )
    # F1 gives partial credit; success stays exact match
    env.reset(seed=7)
    _, reward, term, _, info = env.step(f"<answer>{gold[0]} and more words here</answer>")
    assert term and 0.0 < reward < 1.0 and not info["success"]


def _finish(env):
    inner = env.unwrapped
    while True:
        step = env.step(inner.expert_action())
        if step[2] or step[3]:
            return step


def test_search_r1_tags_format():
    env = gym.make(ENV, action_format="tags", hops=3)
    obs, _ = env.reset(seed=1)
    assert "<search>" in obs[0]["content"] and "<information>" in obs[0]["content"]
    inner = env.unwrapped
    action = inner.expert_action()
    assert action.startswith("<search>")
    obs, *_ = env.step(f"<think>first hop</think>{action}")
    assert obs[0]["content"].startswith("<information>Doc 1(Title: ")
    assert _finish(env)[4]["success"]


def test_bad_queries_are_observations_not_crashes():
    env = gym.make(ENV)
    env.reset(seed=0)
    for query in ["", "   ", "x" * 2000, "??? !!!", "\x00"]:
        call = json.dumps({"name": "search", "arguments": {"query": query}})
        obs, _reward, term, _trunc, _info = env.step(f"<tool_call>{call}</tool_call>")
        assert not term and obs and obs[0]["role"] == "tool"
    assert "Error" in env.unwrapped.transcript[3]["content"]


def test_fork_continues_the_same(env_id=ENV):
    env = gym.make(env_id, hops=4)
    env.reset(seed=11)
    inner = env.unwrapped
    env.step(inner.expert_action())
    state = inner.get_state()
    first = _finish(env)
    inner.set_state(state)
    second = _finish(env)
    assert first[1:4] == second[1:4] and first[4]["success"] == second[4]["success"]


@pytest.mark.parametrize(
    "kwargs",
    [{"reward": "bleu"}, {"topk": 0}, {"hops": 7}, {"question_kinds": ["riddle"]}, {"num_passages": 5}],
)
def test_bad_arguments_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        gym.make(ENV, **kwargs)


# ----- users' corpora and QA files --------------------------------------------------------------------------
def _write_corpus(path):
    docs = [
        {
            "id": "d1",
            "title": "Lake Vostra",
            "text": "Lake Vostra is a lake in Pelland. Its depth is 80 metres.",
        },
        {"id": "d2", "title": "Pelland", "text": "Pelland is a country whose capital is Orvik."},
        {"id": "d3", "contents": '"Orvik"\nOrvik is the capital of Pelland, founded in 1204.'},
    ]
    path.write_text("\n".join(json.dumps(d) for d in docs) + "\n")


def test_user_corpus_with_hotpot_nq_and_search_r1_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLGYM_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.jsonl"
    _write_corpus(corpus)
    hotpot = tmp_path / "hotpot.json"
    hotpot.write_text(
        json.dumps([{"_id": "h1", "question": "When was the capital of Pelland founded?", "answer": "1204"}])
    )
    nq = tmp_path / "nq.jsonl"
    nq.write_text(
        json.dumps({"id": "n1", "question": "capital of pelland", "golden_answers": ["Orvik", "Orvík"]})
    )
    parquet = tmp_path / "train.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {
        "data_source": "nq",
        "prompt": [
            {"role": "user", "content": "Answer the given question... Question: capital of pelland?\n"}
        ],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Orvik"]}},
        "extra_info": {"split": "train", "index": 0},
    }
    pq.write_table(pa.Table.from_pylist([row]), parquet)
    assert load_questions(parquet)[0].question == "capital of pelland?"
    assert load_questions(nq)[0].answers == ["Orvik", "Orvík"]
    for qa in (hotpot, nq, parquet):
        env = gym.make(ENV, corpus=str(corpus), questions=str(qa))
        obs, info = env.reset(seed=0)
        assert obs[1]["content"].startswith("Question: ")
        obs, *_ = env.step(env.unwrapped.expert_action())
        assert "Title: Orvik" in obs[0]["content"] or "Title: Pelland" in obs[0]["content"]
        *_, info = env.step(env.unwrapped.expert_action())
        assert info["success"]


def test_user_corpus_needs_questions_and_bad_files_are_config_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLGYM_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.jsonl"
    _write_corpus(corpus)
    with pytest.raises(ConfigError, match="questions="):
        gym.make(ENV, corpus=str(corpus))
    with pytest.raises(ConfigError):
        gym.make(ENV, corpus=str(tmp_path / "missing.jsonl"), questions=str(tmp_path / "q.json"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no answer here"}\n')
    with pytest.raises(ConfigError, match="no usable questions"):
        load_questions(bad)


def test_extract_reads_only_the_titled_passage():
    obs = (
        "Doc 1(Title: Ada Lorne Street) Ada Lorne Street is a street in Tessmark.\n"
        "Doc 2(Title: Ada Lorne) Ada Lorne (born 3 May 1871 in Port Elvane) was a poet."
    )
    assert extract(obs, "Ada Lorne", "birthplace") == "Port Elvane"
    assert extract(obs, "Ada Lorne", "birth_date") == "3 May 1871"
    assert extract(obs, "Bo Rinn", "birthplace") is None
