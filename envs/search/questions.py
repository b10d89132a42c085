"""Multi-hop questions over a :class:`~toolgym.envs.search.kb.World`, each with its gold aliases and a plan.

Kinds, by the number of passages one must read (hops):

- ``single`` (1): one relation or attribute of a named entity.
- ``composition`` (2–4): a chain of relations ending in an entity ("Which city is the birthplace of the
  founder of X?").
- ``bridge`` (2–4): a chain through bridge entities ending in a date or year ("In which year was the company
  founded by the creator of X founded?").
- ``comparison`` (2 or 4): which of two entities came first, directly or through a bridge each.
- ``intersection`` (2 or 3): the one person both born in a city and an alumnus of a university (then, at 3
  hops, their date of birth).

A plan is the list of lookups that answer the question, written against names from the question and the
results of earlier steps only (never the answer), so the scripted expert can run it against what its
searches return.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolgym.envs.search.kb import LIST_CAP, World
from toolgym.errors import ConfigError

# relation: (subject type, object type)
RELATIONS = {
    "creator": ("work", "person"),
    "birthplace": ("person", "city"),
    "alma_mater": ("person", "org"),
    "founder": ("org", "person"),
    "seat": ("org", "city"),
    "country": ("city", "country"),
    "capital": ("country", "city"),
}
ATTRIBUTES = {"birth_date": "person", "year": "work", "founded": "org"}
NOUN_PHRASES = {
    "creator": "the creator of {}",
    "birthplace": "the birthplace of {}",
    "alma_mater": "the university attended by {}",
    "founder": "the founder of {}",
    "seat": "the city where {} is based",
    "country": "the country of {}",
    "capital": "the capital of {}",
}
ENTITY_QUESTION = {
    "person": "Who is {}?",
    "city": "What is {}?",
    "country": "What is {}?",
    "org": "What is {}?",
}
ATTRIBUTE_QUESTION = {
    "birth_date": "When was {} born?",
    "year": "In which year was {} completed?",
    "founded": "In which year was {} founded?",
}
KINDS_BY_HOPS = {
    1: ("single",),
    2: ("composition", "bridge", "comparison", "intersection"),
    3: ("composition", "bridge", "intersection"),
    4: ("composition", "bridge", "comparison"),
}
# pairs that lead straight back (the country of a country's capital is that country)
_BACK = {("capital", "country"), ("country", "capital")}


@dataclass
class Question:
    """One question: text, gold aliases (first = canonical), hops, kind and the expert's plan."""

    qid: str
    text: str
    answers: list[str]
    hops: int
    kind: str
    plan: list[dict[str, Any]] = field(default_factory=list)


def _follow(subject: str | int, relation: str) -> dict[str, Any]:
    return {"op": "follow", "subject": subject, "relation": relation}


class QuestionMaker:
    """Draws questions from a world with a numpy Generator (the env's ``np_random``)."""

    def __init__(self, world: World) -> None:
        self.w = world

    # ----- entity helpers ----------------------------------------------------------------------------------
    def apply(self, relation: str, i: int) -> int:
        w = self.w
        table = {
            "creator": w.work_creator,
            "birthplace": w.person_birthplace,
            "alma_mater": w.person_alma,
            "founder": w.org_founder,
            "seat": w.org_seat,
            "country": w.city_country,
            "capital": w.country_capital,
        }
        return int(table[relation][i])

    def count(self, kind: str) -> int:
        w = self.w
        return {
            "person": w.n_person,
            "work": w.n_work,
            "org": w.n_org,
            "city": w.n_city,
            "country": w.n_country,
        }[kind]

    def mention(self, kind: str, i: int) -> str:
        if kind == "work":
            return f"the {self.w.work_kind(i)} {self.w.work_titles[i]}"
        return self.w.name(kind, i)

    def aliases(self, kind: str, i: int) -> list[str]:
        name = self.w.name(kind, i)
        out = [name]
        if kind == "org" and name.startswith("University of "):
            out.append(name.removeprefix("University of ") + " University")
        elif kind == "org" and name.endswith(" University"):
            out.append("University of " + name.removesuffix(" University"))
        return out

    def attribute(self, attr: str, i: int) -> tuple[tuple[int, ...], list[str]]:
        """(sortable value, aliases) of a literal attribute."""
        w = self.w
        if attr == "birth_date":
            d = w.birth_date(i)
            return (d.year, d.month, d.day), d.aliases()
        year = int(w.work_year[i] if attr == "year" else w.org_year[i])
        return (year,), [str(year)]

    # ----- drawing -----------------------------------------------------------------------------------------
    def make(self, rng: np.random.Generator, hops: int, kind: str | None = None) -> Question:
        if hops not in KINDS_BY_HOPS:
            raise ConfigError(f"hops must be 1, 2, 3 or 4, got {hops}")
        kinds = KINDS_BY_HOPS[hops]
        if kind is None:
            kind = kinds[int(rng.integers(len(kinds)))]
        elif kind not in kinds:
            raise ConfigError(f"no {kind!r} questions of {hops} hops; kinds at {hops} hops: {list(kinds)}")
        for _ in range(200):
            q = getattr(self, f"_{kind}")(rng, hops)
            if q is not None:
                digest = hashlib.sha1(q.text.encode()).hexdigest()[:10]
                q.qid = f"kb{self.w.seed}n{self.w.num_passages}-{kind}{hops}-{digest}"
                return q
        raise ConfigError(
            f"could not draw a {kind} question of {hops} hops from this world; use more passages"
        )

    def _walk(self, rng: np.random.Generator, length: int, end_types: tuple[str, ...]) -> list[Any] | None:
        """A chain of ``length`` relations from a random start entity, ending on one of ``end_types``."""
        start_types = ("person", "work", "org", "city", "country")
        kind = start_types[int(rng.integers(len(start_types)))]
        start = int(rng.integers(self.count(kind)))
        path: list[str] = []
        seen = {(kind, start)}
        i = start
        for _ in range(length):
            options = [r for r, (s, _) in RELATIONS.items() if s == kind and ([*path[-1:], r]) not in _BACK_L]
            if not options:
                return None
            r = options[int(rng.integers(len(options)))]
            i, kind = self.apply(r, i), RELATIONS[r][1]
            if (kind, i) in seen:
                return None
            seen.add((kind, i))
            path.append(r)
        if kind not in end_types:
            return None
        start_kind = RELATIONS[path[0]][0] if path else kind
        return [start_kind, start, path, kind, i]

    def _chain_text(self, start_kind: str, start: int, path: list[str]) -> str:
        np_ = self.mention(start_kind, start)
        for r in path:
            np_ = NOUN_PHRASES[r].format(np_)
        return np_

    def _chain_plan(self, start_kind: str, start: int, path: list[str]) -> list[dict[str, Any]]:
        plan = [_follow(self.w.name(start_kind, start), path[0])]
        plan += [_follow(k, r) for k, r in enumerate(path[1:])]
        return plan

    def _composition(self, rng: np.random.Generator, hops: int) -> Question | None:
        walk = self._walk(rng, hops, ("person", "city", "country", "org"))
        if walk is None:
            return None
        start_kind, start, path, end_kind, end = walk
        text = ENTITY_QUESTION[end_kind].format(self._chain_text(start_kind, start, path))
        text = text[0].upper() + text[1:]
        return Question(
            "", text, self.aliases(end_kind, end), hops, "composition", self._chain_plan(*walk[:3])
        )

    def _bridge(self, rng: np.random.Generator, hops: int) -> Question | None:
        walk = self._walk(rng, hops - 1, tuple(ATTRIBUTES.values()))
        if walk is None:
            return None
        start_kind, start, path, end_kind, end = walk
        attr = next(a for a, t in ATTRIBUTES.items() if t == end_kind)
        subject = self._chain_text(start_kind, start, path)
        text = ATTRIBUTE_QUESTION[attr].format(subject)
        _, aliases = self.attribute(attr, end)
        if path:
            plan = [*self._chain_plan(start_kind, start, path), _follow(len(path) - 1, attr)]
        else:
            plan = [_follow(self.w.name(end_kind, end), attr)]
        return Question("", text, aliases, hops, "bridge", plan)

    def _single(self, rng: np.random.Generator, hops: int) -> Question | None:
        q = self._composition(rng, 1) if rng.random() < 0.5 else self._bridge(rng, 1)
        if q is not None:
            q.kind = "single"
        return q

    def _comparison(self, rng: np.random.Generator, hops: int) -> Question | None:
        if hops == 2:
            kind = ("person", "work", "org")[int(rng.integers(3))]
            attr = next(a for a, t in ATTRIBUTES.items() if t == kind)
            a, b = (int(x) for x in rng.integers(self.count(kind), size=2))
            va, vb = self.attribute(attr, a)[0], self.attribute(attr, b)[0]
            if a == b or va == vb:
                return None
            first = a if va < vb else b
            ma, mb = self.mention(kind, a), self.mention(kind, b)
            verb = {"person": "born", "work": "completed", "org": "founded"}[kind]
            who = "Who" if kind == "person" else "Which"
            text = f"{who} was {verb} earlier, {ma} or {mb}?"
            plan = [
                _follow(self.w.name(kind, a), attr),
                _follow(self.w.name(kind, b), attr),
                {"op": "earlier", "names": [self.w.name(kind, a), self.w.name(kind, b)], "args": [0, 1]},
            ]
            return Question("", text, self.aliases(kind, first), hops, "comparison", plan)
        kind, rel = (("work", "creator"), ("org", "founder"))[int(rng.integers(2))]
        a, b = (int(x) for x in rng.integers(self.count(kind), size=2))
        pa, pb = self.apply(rel, a), self.apply(rel, b)
        va, vb = self.attribute("birth_date", pa)[0], self.attribute("birth_date", pb)[0]
        if pa == pb or va == vb:
            return None
        first = pa if va < vb else pb
        na, nb = (NOUN_PHRASES[rel].format(self.mention(kind, x)) for x in (a, b))
        text = f"Who was born earlier, {na} or {nb}?"
        plan = [
            _follow(self.w.name(kind, a), rel),
            _follow(self.w.name(kind, b), rel),
            _follow(0, "birth_date"),
            _follow(1, "birth_date"),
            {"op": "earlier", "names": [0, 1], "args": [2, 3]},
        ]
        return Question("", text, self.aliases("person", first), hops, "comparison", plan)

    def _intersection(self, rng: np.random.Generator, hops: int) -> Question | None:
        w = self.w
        p = int(rng.integers(w.n_person))
        c, u = int(w.person_birthplace[p]), int(w.person_alma[p])
        born, alumni = w.members(w.born_in, c), w.members(w.alumni, u)
        if p not in born[:LIST_CAP] or p not in alumni[:LIST_CAP] or len(set(born) & set(alumni)) != 1:
            return None
        city, univ = w.city_names[c], w.org_names[u]
        plan: list[dict[str, Any]] = [
            _follow(city, "born_in"),
            _follow(univ, "alumni"),
            {"op": "intersect", "args": [0, 1]},
        ]
        if hops == 2:
            text = f"Which person was born in {city} and studied at {univ}?"
            return Question("", text, self.aliases("person", p), hops, "intersection", plan)
        text = f"What is the date of birth of the person who was born in {city} and studied at {univ}?"
        plan.append(_follow(2, "birth_date"))
        return Question("", text, self.attribute("birth_date", p)[1], hops, "intersection", plan)


_BACK_L = [list(pair) for pair in _BACK]
