"""``toolgym search-index`` (build and cache a BM25 index) and ``toolgym serve-retriever`` (a Search-R1-style
retrieval server)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from toolgym.errors import ConfigError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "search-index",
        help="build (and cache) the BM25 index of a corpus, or write and index a synthetic corpus",
    )
    _source_args(p)
    p.add_argument(
        "--out", type=Path, help="with --synthetic: also write DIR/corpus.jsonl and DIR/world.json"
    )
    p.set_defaults(func=cmd_index)
    p = subparsers.add_parser("serve-retriever", help="serve a corpus over Search-R1's /retrieve protocol")
    _source_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 to serve other machines)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--topk", type=int, default=3, help="passages per query when a request names none")
    p.set_defaults(func=cmd_serve)


def _source_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--corpus", type=Path, help="a JSONL corpus (id/title/text, or Search-R1's contents)")
    group.add_argument("--synthetic", type=int, metavar="N", help="the synthetic world of N passages")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic world")


def _retriever(args: argparse.Namespace) -> Any:
    from toolgym.optional import require

    require("bm25s", why="the search index")
    from toolgym.envs.search.sources import corpus_retriever, world, world_retriever

    if args.corpus is not None:
        return corpus_retriever(args.corpus, show_progress=True)
    return world_retriever(world(args.seed, args.synthetic), show_progress=True)


def cmd_index(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    if args.synthetic is not None and args.out is not None:
        from toolgym.envs.search.corpus import write_world_jsonl
        from toolgym.envs.search.kb import KB_VERSION
        from toolgym.envs.search.sources import corpus_retriever, world

        w = world(args.seed, args.synthetic)
        corpus = args.out / "corpus.jsonl"
        write_world_jsonl(w, corpus)
        meta = {"seed": args.seed, "num_passages": args.synthetic, "kb_version": KB_VERSION}
        (args.out / "world.json").write_text(json.dumps(meta))
        retriever = corpus_retriever(corpus, show_progress=True)
        print(f"wrote {corpus} ({args.synthetic} passages) and {args.out / 'world.json'}")
    elif args.out is not None:
        raise ConfigError("--out goes with --synthetic (a corpus of your own is indexed where it is)")
    else:
        retriever = _retriever(args)
    print(f"index of {retriever.index.num_docs} passages ready in {time.perf_counter() - start:.1f}s")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from toolgym.optional import require

    uvicorn = require("uvicorn", extra="search", why="serve-retriever runs on it")
    from toolgym.envs.search.retrieval_server import create_app

    if not 1 <= args.topk <= 100:
        raise ConfigError(f"--topk must be between 1 and 100, got {args.topk}")
    retriever = _retriever(args)
    app = create_app(retriever, default_topk=args.topk, num_docs=retriever.index.num_docs)
    print(
        f"serving {retriever.index.num_docs} passages on http://{args.host}:{args.port}/retrieve", flush=True
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
