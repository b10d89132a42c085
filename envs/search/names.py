"""Seeded lexicons of invented names, so that no answer can be recalled from pretraining.

Every entity gets a unique name by a bijection from its index onto a product of word lists (an affine map
modulo the product's size, then mixed-radix digits), so a million names need no set of seen names and cost
one integer operation each.
"""

from __future__ import annotations

import functools
import math

import numpy as np

ONSETS = (
    "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
    "br", "dr", "gr", "kr", "tr", "th", "st", "sh", "ch", "fl", "gl", "pr", "sk", "sl", "j", "y",
)  # fmt: skip
VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou", "ia", "y")
CODAS = ("", "", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "st", "v", "x", "ll", "rn")

ADJECTIVES = (
    "Amber", "Ashen", "Azure", "Bitter", "Black", "Broken", "Burning", "Carved", "Cinder", "Copper", "Crimson",
    "Crooked", "Distant", "Drowned", "Dusky", "Eastern", "Echoing", "Empty", "Evening", "Faded", "Fallen",
    "Final", "Forgotten", "Frozen", "Gilded", "Glass", "Golden", "Gray", "Green", "Hidden", "Hollow", "Idle",
    "Iron", "Ivory", "Last", "Lesser", "Lonely", "Lost", "Low", "Marble", "Midnight", "Misty", "Narrow",
    "Northern", "Oaken", "Pale", "Quiet", "Red", "Restless", "Rusted", "Salt", "Scarlet", "Secret", "Silent",
    "Silver", "Sleeping", "Slow", "Southern", "Stone", "Sunken", "Tall", "Thin", "Twin", "Velvet", "Violet",
    "Wandering", "Western", "White", "Wild", "Winter", "Woven", "Yellow", "Hundredth", "Patient", "Copper",
)  # fmt: skip
NOUNS = (
    "Anchor", "Archive", "Atlas", "Bell", "Bridge", "Candle", "Canal", "Cartographer", "Cathedral", "Chorus",
    "Clock", "Coast", "Compass", "Crown", "Current", "Delta", "Dial", "Door", "Dune", "Ember", "Estuary",
    "Feather", "Ferry", "Field", "Fountain", "Garden", "Gate", "Glacier", "Harbor", "Harvest", "Heron",
    "Horizon", "Hourglass", "Island", "Lantern", "Ledger", "Lighthouse", "Loom", "Map", "Market", "Meridian",
    "Mill", "Mirror", "Monsoon", "Orchard", "Pilgrim", "Quarry", "Reef", "River", "Road", "Sail", "Shepherd",
    "Signal", "Songbird", "Staircase", "Star", "Tide", "Tower", "Valley", "Vessel", "Voyage", "Well", "Willow",
    "Window", "Wolf", "Citadel", "Furnace", "Kite", "Oracle", "Prism", "Sextant", "Telescope", "Weaver",
)  # fmt: skip
CITY_FORMS = (
    "{}", "{}", "{}", "Port {}", "New {}", "{}ford", "{}holm", "{}mark", "{} Falls", "Upper {}", "{}wick",
    "{}ton", "{}burg", "San {}", "{} Bay", "Lower {}",
)  # fmt: skip
COUNTRY_FORMS = ("{}ia", "{}land", "{}a", "{}ora", "{}istan", "Republic of {}", "{}mar", "{}ovia")
COMPANY_WORDS = (
    "Instruments", "Shipping", "Textiles", "Press", "Mining", "Ironworks", "Glassworks", "Bank", "Railways",
    "Brewery", "Telegraph Company", "Pharmaceuticals", "Observatory", "Trading Company", "Foundry",
    "Publishing House", "Porcelain", "Aircraft", "Optics", "Insurance",
)  # fmt: skip
SOCIETY_WORDS = ("Philharmonic", "Geographical Society", "Academy of Arts", "Botanical Society", "Chess Club")
UNIVERSITY_FORMS = ("University of {}", "{} University", "{} Institute of Technology", "{} College")


def _words(rng: np.random.Generator, n: int, syllables: tuple[int, ...], banned: set[str]) -> list[str]:
    """``n`` distinct capitalised pseudo-words of the given syllable counts (built with numpy string ops)."""
    onsets, vowels, codas = np.array(ONSETS), np.array(VOWELS), np.array(CODAS)
    out: dict[str, None] = {}
    while len(out) < n:
        m = 2 * (n - len(out)) + 64
        count = rng.choice(np.array(syllables), size=m)
        parts = [
            np.char.add(onsets[rng.integers(len(ONSETS), size=m)], vowels[rng.integers(len(VOWELS), size=m)])
        ]
        for s in (1, 2):
            more = np.char.add(
                onsets[rng.integers(len(ONSETS), size=m)], vowels[rng.integers(len(VOWELS), size=m)]
            )
            parts.append(np.where(count > s, more, ""))
        words = np.char.add(
            np.char.add(np.char.add(parts[0], parts[1]), parts[2]), codas[rng.integers(len(CODAS), size=m)]
        )
        lengths = np.char.str_len(words)
        for word in words[(lengths >= 4) & (lengths <= 11)].tolist():
            if word not in banned:
                out[word.capitalize()] = None
                if len(out) == n:
                    break
    return list(out)


@functools.lru_cache(maxsize=8)
def lexicon(seed: int, last: int = 8000, place: int = 12000, org: int = 10000, country: int = 400) -> Lexicon:
    """The (cached) lexicon of a world seed, with pools of the given sizes."""
    return Lexicon(seed, last, place, org, country)


class Lexicon:
    """Word lists for one world seed: first names, surnames, and roots for places, organisations and
    countries. The pools never share a word; a world sizes them so that every city and organisation gets a
    root of its own (so a name's rare word points at one entity)."""

    def __init__(self, seed: int, last: int = 8000, place: int = 12000, org: int = 10000, country: int = 400):
        rng = np.random.default_rng([seed, 7919])
        used: set[str] = set()
        pools = []
        for n, syllables in ((400, (2,)), (last, (2, 3)), (place, (2, 3)), (org, (2, 3)), (country, (2, 3))):
            words = _words(rng, n, syllables, used)
            used.update(w.lower() for w in words)
            pools.append(words)
        self.first, self.last, self.place, self.org, self.country = pools


def _coprime(m: int, rng: np.random.Generator) -> int:
    while True:
        a = int(rng.integers(m // 3, max(m // 3 + 2, m - 1))) | 1
        if math.gcd(a, m) == 1:
            return a


def scatter(n: int, space: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` distinct integers in ``[0, space)``, spread out by an affine bijection (no sets needed).

    >>> v = scatter(1000, 5000, np.random.default_rng(0))
    >>> len(set(v.tolist())), int(v.max()) < 5000
    (1000, True)
    """
    if n > space:
        raise ValueError(f"cannot draw {n} distinct names from a space of {space}")
    a = _coprime(space, rng)
    c = int(rng.integers(space))
    return (np.arange(n, dtype=np.int64) * a + c) % space
