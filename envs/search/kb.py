"""A seeded world of invented entities (people, places, organisations, works, dates) and its passages.

The world is a handful of integer arrays (who was born where, who founded what), drawn at once with numpy, so
a world of a million passages takes a few seconds and little memory; passages are rendered one at a time from
those arrays, in a stream, never held all together. Passage ``i`` is always the same text for the same
``(seed, num_passages)``.

Relations (all functional, so every chain of them has one answer):

- work ``creator`` → person; person ``birthplace`` → city; person ``alma_mater`` → university;
  organisation ``founder`` → person; organisation ``seat`` → city; city ``country`` → country;
  country ``capital`` → city.
- literal attributes: person ``birth_date``, work ``year``, organisation ``founded``.

Passages are encyclopedia-like and carry distractors: a person's passage also names the city of their later
life, an organisation's its first director; streets, prizes, statues and stations are named after people and
places, and adaptations share the titles of works.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from toolgym.envs.search.names import (
    ADJECTIVES,
    CITY_FORMS,
    COMPANY_WORDS,
    COUNTRY_FORMS,
    NOUNS,
    SOCIETY_WORDS,
    UNIVERSITY_FORMS,
    lexicon,
    scatter,
)
from toolgym.errors import ConfigError

KB_VERSION = 2
MIN_PASSAGES = 300
MAX_PASSAGES = 2_000_000
LIST_CAP = 12  # names listed in a city's "born in" and a university's "alumni" sentence
MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
OCCUPATIONS = (
    ("novelist", "novel"), ("poet", "poetry collection"), ("painter", "painting"), ("composer", "symphony"),
    ("playwright", "play"), ("cartographer", "atlas"), ("philosopher", "treatise"), ("engineer", "manual"),
    ("astronomer", "star catalogue"), ("sculptor", "sculpture"), ("botanist", "herbarium"),
    ("photographer", "photo series"), ("diplomat", "memoir"), ("mathematician", "monograph"),
    ("architect", "design study"), ("chemist", "textbook"),
)  # fmt: skip
FEATURES = (
    "harbour", "old bridges", "textile mills", "salt marshes", "clock tower", "spring fair", "river port",
    "vineyards", "covered market", "canals", "lighthouse", "glassworks", "botanical garden", "hill fort",
)  # fmt: skip
ENTITY_TYPES = ("country", "city", "org", "person", "work", "distractor")


@dataclass(frozen=True)
class Date:
    year: int
    month: int  # 1..12
    day: int

    def text(self) -> str:
        return f"{self.day} {MONTHS[self.month - 1]} {self.year}"

    def aliases(self) -> list[str]:
        name = MONTHS[self.month - 1]
        return [
            self.text(),
            f"{name} {self.day}, {self.year}",
            f"{self.year}-{self.month:02d}-{self.day:02d}",
        ]


def _csr(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Group the indices of ``keys`` by key: members of key ``k`` are ``order[start[k]:start[k+1]]``."""
    order = np.argsort(keys, kind="stable").astype(np.int64)
    start = np.searchsorted(keys[order], np.arange(n + 1))
    return order, start


def _plural(noun: str) -> str:
    if noun.endswith(("s", "x", "sh", "ch")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" and not noun.startswith(("uni", "eu")) else "a ") + noun


def _join(names: list[str]) -> str:
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


class World:
    """The entities and relations of one seeded world of ``num_passages`` passages.

    >>> w = World(seed=0, num_passages=1000)
    >>> len(w), w.passage(0) == World(seed=0, num_passages=1000).passage(0)
    (1000, True)
    """

    def __init__(self, seed: int = 0, num_passages: int = 10_000) -> None:
        if not MIN_PASSAGES <= num_passages <= MAX_PASSAGES:
            raise ConfigError(
                f"num_passages must be between {MIN_PASSAGES} and {MAX_PASSAGES}, got {num_passages}"
            )
        self.seed = seed
        self.num_passages = n = num_passages
        rng = np.random.default_rng([seed, KB_VERSION, n])
        self.n_country = max(6, n // 2500)
        self.n_city = max(30, n * 8 // 100)
        self.n_org = max(20, n * 15 // 100)
        self.n_univ = max(6, self.n_org // 8)
        self.n_work = n * 18 // 100
        self.n_distractor = n * 12 // 100
        self.n_person = n - self.n_country - self.n_city - self.n_org - self.n_work - self.n_distractor
        self.lex = lexicon(
            seed,
            last=max(8000, self.n_person // 20),
            place=max(12000, self.n_city * 5 // 4),
            org=max(10000, self.n_org * 9 // 8),
            country=max(400, self.n_country * 2),
        )
        counts = (self.n_country, self.n_city, self.n_org, self.n_person, self.n_work, self.n_distractor)
        self.offsets = np.cumsum((0, *counts))
        self._draw(rng)

    # ----- drawing the world -------------------------------------------------------------------------------
    def _draw(self, rng: np.random.Generator) -> None:
        P, W, n_org, C, K, D = (
            self.n_person,
            self.n_work,
            self.n_org,
            self.n_city,
            self.n_country,
            self.n_distractor,
        )
        self.person_birthplace = rng.integers(C, size=P)
        self.person_alma = rng.integers(self.n_univ, size=P)
        self.person_year = rng.integers(1650, 1960, size=P)
        self.person_month = rng.integers(1, 13, size=P)
        self.person_day = rng.integers(1, 29, size=P)
        self.person_occ = rng.integers(len(OCCUPATIONS), size=P)
        self.person_she = rng.random(P) < 0.5
        self.person_late = rng.integers(C, size=P)
        self.person_variant = rng.integers(3, size=(P, 3))
        self.work_creator = rng.integers(P, size=W)
        self.work_year = self.person_year[self.work_creator] + rng.integers(20, 61, size=W)
        self.work_variant = rng.integers(3, size=W)
        self.org_kind = np.where(np.arange(n_org) < self.n_univ, 0, rng.integers(1, 3, size=n_org))
        self.org_founder = rng.integers(P, size=n_org)
        self.org_year = self.person_year[self.org_founder] + rng.integers(25, 61, size=n_org)
        self.org_seat = rng.integers(C, size=n_org)
        self.org_director = rng.integers(P, size=n_org)
        self.org_variant = rng.integers(3, size=n_org)
        # every country gets at least one city: the first K cities, one each, are the capitals
        self.city_country = np.concatenate([np.arange(K), rng.integers(K, size=C - K)])
        self.country_capital = np.arange(K)
        self.city_feature = rng.integers(len(FEATURES), size=C)
        self.city_variant = rng.integers(3, size=C)
        self.country_variant = rng.integers(2, size=K)
        self.distractor_kind = rng.integers(5, size=D)
        self.distractor_target = rng.integers(1 << 30, size=D)
        self.distractor_other = rng.integers(1 << 30, size=D)
        self.distractor_year = rng.integers(1800, 2020, size=D)
        # names: unique by construction (see names.scatter)
        lex = self.lex
        fl = scatter(P, len(lex.first) * len(lex.last), rng)
        self.person_names = [f"{lex.first[j % 400]} {lex.last[j // 400]}" for j in fl.tolist()]
        # cities, countries and organisations each get a root word of their own
        roots = scatter(C, len(lex.place), rng).tolist()
        forms = rng.integers(len(CITY_FORMS), size=C).tolist()
        self.city_names = [CITY_FORMS[f].format(lex.place[r]) for r, f in zip(roots, forms, strict=True)]
        roots = scatter(K, len(lex.country), rng).tolist()
        forms = rng.integers(len(COUNTRY_FORMS), size=K).tolist()
        self.country_names = [
            COUNTRY_FORMS[f].format(lex.country[r]) for r, f in zip(roots, forms, strict=True)
        ]
        self.org_names = self._org_names(rng)
        self.work_titles = self._titles(rng)

    def _org_names(self, rng: np.random.Generator) -> list[str]:
        roots = [self.lex.org[r] for r in scatter(self.n_org, len(self.lex.org), rng).tolist()]
        picks = rng.integers(1 << 20, size=self.n_org).tolist()
        names = []
        for root, kind, pick in zip(roots, self.org_kind.tolist(), picks, strict=True):
            if kind == 0:
                names.append(UNIVERSITY_FORMS[pick % len(UNIVERSITY_FORMS)].format(root))
            elif kind == 1:
                names.append(f"{root} {COMPANY_WORDS[pick % len(COMPANY_WORDS)]}")
            else:
                names.append(f"{root} {SOCIETY_WORDS[pick % len(SOCIETY_WORDS)]}")
        return names

    def _titles(self, rng: np.random.Generator) -> list[str]:
        A, N, R = len(ADJECTIVES), len(NOUNS), len(self.lex.place)
        spaces = (A * N, N * R, N * R, A * N)
        wf = scatter(self.n_work, sum(spaces), rng)
        out = []
        for j in wf.tolist():
            if j < spaces[0]:
                out.append(f"The {ADJECTIVES[j % A]} {NOUNS[j // A]}")
                continue
            j -= spaces[0]
            if j < spaces[1]:
                out.append(f"{_plural(NOUNS[j % N])} of {self.lex.place[j // N]}")
                continue
            j -= spaces[1]
            if j < spaces[2]:
                out.append(f"The {NOUNS[j % N]} of {self.lex.place[j // N]}")
                continue
            j -= spaces[2]
            out.append(f"{ADJECTIVES[j % A]} {_plural(NOUNS[j // A])}")
        return out

    # ----- inverse relations (built on first use) ----------------------------------------------------------
    @cached_property
    def born_in(self) -> tuple[np.ndarray, np.ndarray]:
        return _csr(self.person_birthplace, self.n_city)

    @cached_property
    def alumni(self) -> tuple[np.ndarray, np.ndarray]:
        return _csr(self.person_alma, self.n_univ)

    @cached_property
    def works_of(self) -> tuple[np.ndarray, np.ndarray]:
        return _csr(self.work_creator, self.n_person)

    @cached_property
    def founded_by(self) -> tuple[np.ndarray, np.ndarray]:
        return _csr(self.org_founder, self.n_person)

    @staticmethod
    def members(csr: tuple[np.ndarray, np.ndarray], key: int) -> list[int]:
        order, start = csr
        return order[start[key] : start[key + 1]].tolist()

    # ----- entities ----------------------------------------------------------------------------------------
    def birth_date(self, p: int) -> Date:
        return Date(int(self.person_year[p]), int(self.person_month[p]), int(self.person_day[p]))

    def work_kind(self, w: int) -> str:
        return OCCUPATIONS[int(self.person_occ[self.work_creator[w]])][1]

    def name(self, kind: str, i: int) -> str:
        table = {
            "person": self.person_names,
            "city": self.city_names,
            "country": self.country_names,
            "org": self.org_names,
            "work": self.work_titles,
        }
        return table[kind][i]

    def doc_index(self, kind: str, i: int) -> int:
        """The passage index of entity ``i`` of ``kind``."""
        return int(self.offsets[ENTITY_TYPES.index(kind)]) + i

    def __len__(self) -> int:
        return self.num_passages

    # ----- passages ----------------------------------------------------------------------------------------
    def passage(self, i: int) -> tuple[str, str]:
        """(title, text) of passage ``i``."""
        if not 0 <= i < self.num_passages:
            raise IndexError(i)
        kind = int(np.searchsorted(self.offsets, i, side="right")) - 1
        j = i - int(self.offsets[kind])
        render = (self._country, self._city, self._org, self._person, self._work, self._distractor)[kind]
        return render(j)

    def passages(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[str, str]]:
        for i in range(start, self.num_passages if stop is None else stop):
            yield self.passage(i)

    def _country(self, k: int) -> tuple[str, str]:
        name = self.country_names[k]
        capital = self.city_names[self.country_capital[k]]
        if self.country_variant[k] == 0:
            first = f"{name} is a country whose capital is {capital}."
        else:
            first = f"{name} is a sovereign state. The capital of {name} is {capital}."
        return name, f"{first} {name} is known for its {FEATURES[(k * 7) % len(FEATURES)]}."

    def _city(self, c: int) -> tuple[str, str]:
        name = self.city_names[c]
        country = self.country_names[self.city_country[c]]
        feature = FEATURES[self.city_feature[c]]
        v = self.city_variant[c]
        if v == 0:
            parts = [f"{name} is a city in {country}, known for its {feature}."]
        elif v == 1:
            parts = [f"{name} is a town in {country}. It is famous for its {feature}."]
        else:
            parts = [f"Located in {country}, {name} is a city known for its {feature}."]
        if c < self.n_country:
            parts.append(f"It is the capital of {country}.")
        people = [self.person_names[p] for p in self.members(self.born_in, c)[:LIST_CAP]]
        if people:
            parts.append(f"Notable people born in {name} include {_join(people)}.")
        return name, " ".join(parts)

    def _org(self, o: int) -> tuple[str, str]:
        name = self.org_names[o]
        founder = self.person_names[self.org_founder[o]]
        year = int(self.org_year[o])
        seat = self.city_names[self.org_seat[o]]
        kind = ("university", "company", "society")[self.org_kind[o]]
        v = self.org_variant[o]
        if v == 0:
            parts = [f"{name} is {_a(kind)} founded in {year} by {founder}. It is based in {seat}."]
        elif v == 1:
            parts = [f"Founded by {founder} in {year}, {name} is {_a(kind)} headquartered in {seat}."]
        else:
            parts = [f"{name} was established in {year} by {founder} and has its seat in {seat}."]
        director = self.person_names[self.org_director[o]]
        parts.append(f"Its first director was {director}.")
        if o < self.n_univ:
            alumni = [self.person_names[p] for p in self.members(self.alumni, o)[:LIST_CAP]]
            if alumni:
                parts.append(f"Its notable alumni include {_join(alumni)}.")
        return name, " ".join(parts)

    def _person(self, p: int) -> tuple[str, str]:
        name = self.person_names[p]
        occ = OCCUPATIONS[self.person_occ[p]][0]
        date = self.birth_date(p).text()
        city = self.city_names[self.person_birthplace[p]]
        univ = self.org_names[self.person_alma[p]]
        she = bool(self.person_she[p])
        pron, poss = ("She", "her") if she else ("He", "his")
        v0, v1, v2 = self.person_variant[p]
        if v0 == 0:
            parts = [f"{name} (born {date} in {city}) was {_a(occ)}."]
        elif v0 == 1:
            parts = [f"{name} was {_a(occ)}, born in {city} on {date}."]
        else:
            parts = [f"Born on {date} in {city}, {name} became {_a(occ)}."]
        parts.append(
            (
                f"{pron} studied at {univ}.",
                f"{pron} was educated at {univ}.",
                f"{pron} graduated from {univ}.",
            )[v1]
        )
        for o in self.members(self.founded_by, p)[:2]:
            parts.append(f"In {int(self.org_year[o])} {pron.lower()} founded {self.org_names[o]}.")
        works = self.members(self.works_of, p)[:2]
        if works:
            listed = _join([f"the {self.work_kind(w)} {self.work_titles[w]}" for w in works])
            parts.append(f"{pron} is best known for {listed}.")
        late = self.city_names[self.person_late[p]]
        parts.append(
            (
                f"{pron} spent {poss} later life in {late}.",
                f"{pron} later moved to {late}.",
                f"In old age {pron.lower()} lived in {late}.",
            )[v2]
        )
        return name, " ".join(parts)

    def _work(self, w: int) -> tuple[str, str]:
        title = self.work_titles[w]
        creator = self.person_names[self.work_creator[w]]
        year = int(self.work_year[w])
        kind = self.work_kind(w)
        v = self.work_variant[w]
        if v == 0:
            first = f"{title} is {_a(kind)} by {creator}, completed in {year}."
        elif v == 1:
            first = f"{title} is a {year} {kind} by {creator}."
        else:
            first = f"The {kind} {title} was created by {creator} in {year}."
        return title, f"{first} It was well received and is still widely discussed."

    def _distractor(self, d: int) -> tuple[str, str]:
        kind = self.distractor_kind[d]
        t, o, year = (
            int(self.distractor_target[d]),
            int(self.distractor_other[d]),
            int(self.distractor_year[d]),
        )
        city = self.city_names[o % self.n_city]
        if kind <= 2:
            p = t % self.n_person
            person = self.person_names[p]
            occ = OCCUPATIONS[self.person_occ[p]][0]
            if kind == 0:
                return (
                    f"{person} Street",
                    f"{person} Street is a street in {city}. It was named after the {occ} {person} in {year}.",
                )
            if kind == 1:
                org = self.org_names[o % self.n_org]
                return (
                    f"{person} Prize",
                    f"The {person} Prize is an award presented each year by {org}. "
                    f"It honours the memory of {person}, the {occ}.",
                )
            return (
                f"Statue of {person}",
                f"The Statue of {person} stands in the main square of {city}. "
                f"It was unveiled in {year} and shows the {occ} as a young person.",
            )
        if kind == 3:
            c = t % self.n_city
            here = self.city_names[c]
            return (
                f"{here} Central Station",
                f"{here} Central Station is the main railway station of {here}. "
                f"It opened in {year} and serves the line to {city}.",
            )
        w = t % self.n_work
        title = self.work_titles[w]
        director = self.person_names[o % self.n_person]
        return (
            f"{title} (adaptation)",
            f"{title} is also the name of a {year} stage adaptation of the {self.work_kind(w)}. "
            f"The adaptation was directed by {director}.",
        )
