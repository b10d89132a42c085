"""The latent strategy space: discussion utterances embedded, clustered per role (k-means), expanded with
each iteration's new utterances.

Embedding: TF-IDF over word uni- and bigrams, reduced by a truncated SVD (LSA) to ``dim`` dimensions and
L2-normalised. Why not the paper's embedding model (OpenAI text-embedding-3-small): nothing may be fetched
at run time; why not the policy's mean hidden state: a 135M model's speeches are near-templates whose
differences are lexical (who is accused, whether a seer is claimed), which TF-IDF separates exactly and the
policy's hidden states blur, and the space must not move when the policy's weights do (the abstracted game
and the DPO pairs of one iteration are built on the same space). ``model_embeddings`` is the other choice,
for a bigger model.

Player names are abstracted before embedding: every ``P<n>`` becomes ``PX`` (``canonical``), so "I suspect
P3." and "I suspect P5." are one strategy; the abstracted game fills the names back from the speaker's own
suspicion ranking (``game.realise``). A cluster keeps its members' canonical texts and its template (the
member nearest the centroid). Each role has its own clusters (what a speaker of that role may choose); the
``public`` clusters are over every role's utterances (what a listener perceives, since a listener does not
know the speaker's role).

Expansion (the paper's "latent space expansion"): the embedding is refitted on every utterance so far, the
old clusters keep their members (centroids recomputed), each new utterance joins its nearest cluster unless
it is farther than the 95th percentile of the members' distances (at least ``min_radius``), and the far ones
form up to ``new_k`` new clusters.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolgym.errors import ConfigError

_PLAYER = re.compile(r"\bP\d+\b")
_WORD = re.compile(r"[a-z]+|px|[?!.]")


def canonical(text: str) -> str:
    """The utterance with player names abstracted and whitespace collapsed.

    >>> canonical("I am the seer.  P3 is a werewolf.")
    'I am the seer. PX is a werewolf.'
    """
    return " ".join(_PLAYER.sub("PX", text).split())[:400]


def _terms(text: str) -> list[str]:
    words = _WORD.findall(text.lower())
    return words + [f"{a} {b}" for a, b in itertools.pairwise(words)]


@dataclass
class TfidfSvd:
    """TF-IDF (smoothed idf, sublinear tf) then a truncated SVD, fitted on a list of texts."""

    dim: int = 16
    vocab: dict[str, int] = field(default_factory=dict)
    idf: np.ndarray = field(default_factory=lambda: np.zeros(0))
    components: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [dim, V]

    def fit(self, texts: Sequence[str]) -> TfidfSvd:
        docs = [_terms(t) for t in texts]
        df = Counter(term for d in docs for term in set(d))
        self.vocab = {t: i for i, t in enumerate(sorted(df))}
        n = len(docs)
        self.idf = np.array([np.log((1 + n) / (1 + df[t])) + 1.0 for t in sorted(df)])
        X = self._tfidf(docs)
        # the top right-singular vectors of the unique rows span the space (duplicates only reweight it)
        _, _, vt = np.linalg.svd(np.unique(np.round(X, 9), axis=0), full_matrices=False)
        self.components = vt[: self.dim]
        return self

    def _tfidf(self, docs: list[list[str]]) -> np.ndarray:
        X = np.zeros((len(docs), len(self.vocab)))
        for i, d in enumerate(docs):
            for term, c in Counter(d).items():
                j = self.vocab.get(term)
                if j is not None:
                    X[i, j] = (1 + np.log(c)) * self.idf[j]
        norms = np.linalg.norm(X, axis=1, keepdims=True)
        return X / np.where(norms > 0, norms, 1.0)

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        Z = self._tfidf([_terms(t) for t in texts]) @ self.components.T  # [N, dim]
        norms = np.linalg.norm(Z, axis=1, keepdims=True)
        return Z / np.where(norms > 0, norms, 1.0)


def model_embeddings(model: Any, tokenizer: Any, texts: Sequence[str], device: Any = "cpu") -> np.ndarray:
    """The policy's mean-pooled last hidden state of each text [N, H], L2-normalised (the other embedding)."""
    import torch

    out = []
    with torch.no_grad():
        for t in texts:
            ids = torch.tensor([tokenizer(t)["input_ids"] or [0]], device=device)
            h = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0].float().mean(0)
            out.append((h / h.norm().clamp_min(1e-9)).cpu().numpy())
    return np.stack(out)


def kmeans(X: np.ndarray, k: int, rng: np.random.Generator, iters: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means with k-means++ seeding: (centroids [k, d], labels [N]). ``k`` is capped by the number
    of distinct points."""
    distinct = np.unique(
        np.round(X, 6), axis=0
    )  # (rounded: one text embedded in two batches differs by ulps)
    k = max(1, min(k, len(distinct)))
    centroids = [distinct[int(rng.integers(len(distinct)))]]
    for _ in range(1, k):
        d2 = np.min(((distinct[:, None, :] - np.array(centroids)[None]) ** 2).sum(-1), axis=1)
        centroids.append(distinct[int(rng.choice(len(distinct), p=d2 / d2.sum()))])
    C = np.array(centroids)
    labels = np.zeros(len(X), dtype=int)
    for _ in range(iters):
        labels = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
        new = np.array([X[labels == j].mean(0) if (labels == j).any() else C[j] for j in range(k)])
        if np.allclose(new, C):
            break
        C = new
    return C, labels


@dataclass
class Cluster:
    members: list[str]  # canonical texts (repeats kept: they weigh the centroid)
    centroid: np.ndarray
    template: str  # the member nearest the centroid

    def to_dict(self) -> dict[str, Any]:
        common = Counter(self.members).most_common(3)
        return {"template": self.template, "size": len(self.members), "common": common}


def _clusters(texts: list[str], X: np.ndarray, k: int, rng: np.random.Generator) -> list[Cluster]:
    C, labels = kmeans(X, k, rng)
    out = []
    for j in range(len(C)):
        idx = np.flatnonzero(labels == j)
        if len(idx) == 0:
            continue
        centroid = X[idx].mean(0)
        near = idx[int(((X[idx] - centroid) ** 2).sum(-1).argmin())]
        out.append(Cluster([texts[i] for i in idx], centroid, texts[near]))
    return out


@dataclass
class LatentSpace:
    embedder: TfidfSvd
    roles: dict[str, list[Cluster]]
    public: list[Cluster]
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        utterances: Sequence[tuple[str, str]],
        k: int = 4,
        k_public: int = 4,
        seed: int = 0,
        dim: int = 16,
    ) -> LatentSpace:
        """Clusters per role (and public) of (role, text) utterances."""
        if not utterances:
            raise ConfigError("no discussion utterances to build a latent space from")
        rng = np.random.default_rng(seed)
        texts = [canonical(t) for _, t in utterances]
        emb = TfidfSvd(dim).fit(texts)
        X = emb.transform(texts)
        roles: dict[str, list[Cluster]] = {}
        for role in sorted({r for r, _ in utterances}):
            idx = [i for i, (r, _) in enumerate(utterances) if r == role]
            roles[role] = _clusters([texts[i] for i in idx], X[idx], k, rng)
        return cls(emb, roles, _clusters(texts, X, k_public, rng))

    def embed(self, text: str) -> np.ndarray:
        key = canonical(text)
        if key not in self._cache:
            self._cache[key] = self.embedder.transform([key])[0]
        return self._cache[key]

    @staticmethod
    def _nearest(clusters: list[Cluster], x: np.ndarray) -> int:
        return int(np.argmin([((c.centroid - x) ** 2).sum() for c in clusters]))

    def role_latent(self, role: str, text: str) -> int:
        """The speaker's latent strategy z = argmin_j ||e(u) − μ_j||² among its role's clusters."""
        if role not in self.roles:
            raise ConfigError(f"the latent space has no clusters for role {role!r}")
        return self._nearest(self.roles[role], self.embed(text))

    def public_latent(self, text: str) -> int:
        return self._nearest(self.public, self.embed(text))

    def sizes(self) -> dict[str, int]:
        return {**{r: len(c) for r, c in self.roles.items()}, "public": len(self.public)}

    def expand(
        self, utterances: Sequence[tuple[str, str]], new_k: int = 2, seed: int = 0, min_radius: float = 0.2
    ) -> LatentSpace:
        """A new space: the old clusters (re-embedded) plus up to ``new_k`` new clusters per role (and public)
        from the new utterances far from every old one (module docstring)."""
        rng = np.random.default_rng(seed)
        old = [t for cs in self.roles.values() for c in cs for t in c.members]
        fresh = [canonical(t) for _, t in utterances]
        emb = TfidfSvd(self.embedder.dim).fit(old + fresh)

        def grow(clusters: list[Cluster], texts: list[str]) -> list[Cluster]:
            kept = [Cluster(list(c.members), emb.transform(c.members).mean(0), c.template) for c in clusters]
            dists = [np.sqrt(((emb.transform(c.members) - c.centroid) ** 2).sum(-1)) for c in kept]
            # a floor: near-duplicates (a cluster of one repeated template has radius 0) are not new strategies
            cut = max(float(np.percentile(np.concatenate(dists), 95)) if kept else 0.0, min_radius)
            far: list[str] = []
            for t in texts:
                x = emb.transform([t])[0]
                j = self._nearest(kept, x) if kept else -1
                if j >= 0 and np.sqrt(((kept[j].centroid - x) ** 2).sum()) <= cut:
                    kept[j].members.append(t)
                else:
                    far.append(t)
            if far:
                kept += _clusters(far, emb.transform(far), new_k, rng)
            for c in kept:  # centroids of the grown clusters
                c.centroid = emb.transform(c.members).mean(0)
            return kept

        roles = {}
        for role in sorted(set(self.roles) | {r for r, _ in utterances}):
            mine = [canonical(t) for r, t in utterances if r == role]
            roles[role] = grow(self.roles.get(role, []), mine)
        return LatentSpace(emb, roles, grow(self.public, fresh))

    def to_dict(self) -> dict[str, Any]:
        return {
            "roles": {r: [c.to_dict() for c in cs] for r, cs in self.roles.items()},
            "public": [c.to_dict() for c in self.public],
        }
