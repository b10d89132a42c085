"""The founding papers' claims as comparisons on our envs: one `Claim` a paper's headline, each arm a set of
trainer-config overrides on one shared base, every arm run with the same seeds from one shared warm start.

A claim names the paper's own number, our setting and every departure from the official code's
hyperparameters (docs/trainer.md lists those), so the report can print them beside our result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)  # trainer-config fields over the claim's base
    gpu_gb: float = 0.0  # peak GPU memory of one run, KV cache included (0: the claim's `gpu_gb`)


@dataclass(frozen=True)
class Claim:
    name: str
    title: str
    paper: str  # the paper's headline number, in words
    env_id: str
    env_kwargs: dict[str, Any]
    eval_env_kwargs: dict[str, Any]
    sft: dict[str, Any]  # `toolgym sft` fields of the shared warm start
    rl: dict[str, Any]  # `toolgym train` fields every arm shares
    arms: tuple[Arm, ...]
    baseline: str  # the arm every gain is measured against
    departures: tuple[str, ...] = ()
    # The run folder, when it is another claim's: that claim's warm start and its runs of the arms both
    # name (same overrides, same env) are shared, so a shared baseline is run once. "" = the claim's name.
    folder: str = ""
    gpu_gb: float = 20.0  # estimated peak GPU memory of one run (the driver packs runs into GPUs by it)
    kv_gb: float = 6.0  # the rollout engine's KV cache of one run (sets `engine_memory`)
    needs: tuple[str, ...] = ()  # what the machine must have beyond torch: "bm25s", "bwrap", "chromium"
    band: tuple[float, float] = (0.10, 0.60)  # warm-start held-out success outside it: RL is not started
    report: tuple[str, ...] = ()  # extra report sections: "tool_calls", "collapse"
    level_note: str = ""  # how the env level and the warm start were chosen

    @property
    def dir(self) -> str:
        return self.folder or self.name


# Household at a level of >= 8 expert turns on average: two rooms, two-object and clean/heat/cool tasks
# (expert 7.9 turns, median 8, 90th percentile 10 on 40 seeds; the model's own episodes run longer).
HOUSEHOLD = {
    "rooms": 2,
    "receptacles": 12,
    "distractors": 3,
    "task_types": ["two", "clean", "heat", "cool"],
    "list_commands": True,
    "max_turns": 16,
    "split": "train",
}
CHAIN = {
    "prompt_format": "text",
    "action_format": "tags",
    "lenient_answers": False,
    "num_ops": [2, 3],
    "split": "train",
}

# Search-v0 at three hops (4 expert turns: three searches and the answer, ~700 tokens of passages; 40 seeds),
# Search-R1's tag protocol and top-3 passages.
SEARCH = {"hops": 3, "action_format": "tags", "topk": 3, "max_turns": 8}
# PythonMath-v0 at difficulty 2 (numbers too large to do by hand; the expert's program is 139 tokens on average,
# 292 at most, then the boxed answer: 2 turns), in the process sandbox (the GPU machine has no docker).
PYTHON_MATH = {
    "difficulty": 2, "action_format": "hermes", "max_turns": 5, "sandbox": "process",
    "sandbox_options": {"pool_size": 24},
}  # fmt: skip
# MiniWoB tasks whose scripted solvers (envs/web/expert.py) take 1.8-3 turns on average, 4 at most (5 seeds
# each), read from the text observation: forms, tabs, lists, checkboxes, dates. One-click tasks (click-button,
# click-link) would be solved from the start, long calendars (choose-date: 8.8 turns, 14 at most) almost never.
WEB_TASKS = [
    "login-user", "click-checkboxes", "click-tab-2", "choose-list", "click-option", "enter-date",
    "click-collapsible", "choose-date-easy", "click-button-sequence", "enter-text-2",
]  # fmt: skip
WEB = {"tasks": WEB_TASKS, "max_turns": 8}

# ARPO: fork after a tool result when the entropy rose (c_pen 0 is ARPO; AEPO's 0.05 is the config default),
# half the budget as global samples (the trainer's default for branching), beam 2, tau 0.5, w 0.2
ARPO = {"branching": "turn_entropy", "estimator": "tree", "branch_kwargs": {"consecutive_penalty": 0.0}}
APPO = {"branching": "branching_score", "estimator": "tree"}

RL_BASE: dict[str, Any] = {
    "algorithm": "grpo", "prompts_per_step": 8, "budget": 8, "temperature": 1.0, "lr": 1.0e-5,
    "minibatches": 2, "micro_batch_rows": 8, "eval_every": 10, "eval_episodes": 64, "save_every": 5,
}  # fmt: skip
SFT_BASE: dict[str, Any] = {"epochs": 1, "batch_size": 16, "lr": 5.0e-5}  # every warm start's recipe

# 2048 expert episodes x 2 epochs: held-out 0.27 on 4 x H200 (512 x 1 gave 0.03; 1024 x 4 at lr 1e-4 and
# 4096 x 1 gave 0.25): benchmarks/results/papers_warmstart.md. RL steps: what one machine lifetime holds (PLAN.md)
HOUSEHOLD_SFT = {**SFT_BASE, "episodes": 2048, "epochs": 2, "max_new_tokens": 32, "max_total_tokens": 3072}
HOUSEHOLD_RL = {**RL_BASE, "max_new_tokens": 32, "max_total_tokens": 3072, "steps": 60}
SEARCH_SFT = {**SFT_BASE, "episodes": 512, "max_new_tokens": 64, "max_total_tokens": 2048}
# ARPO's rollout budget per question (M = 16, N = 8 global samples) for every arm, so GRPO sees as many paths
SEARCH_RL = {**RL_BASE, "budget": 16, "max_new_tokens": 64, "max_total_tokens": 2048, "steps": 50}

CLAIMS: dict[str, Claim] = {
    c.name: c
    for c in (
        Claim(
            name="gigpo_household",
            title="Turn-level credit on a long-horizon household task (GiGPO)",
            paper="GiGPO (Feng et al. 2025, arXiv 2505.10978): > 12 points of ALFWorld success over GRPO with "
            "Qwen2.5-1.5B/7B-Instruct (and > 9 on WebShop)",
            env_id="toolgym/Household-v0",
            env_kwargs=HOUSEHOLD,
            eval_env_kwargs={"split": "seen"},
            sft=HOUSEHOLD_SFT,
            rl=HOUSEHOLD_RL,
            arms=(
                Arm("grpo"),
                Arm("gigpo", {"estimator": "gigpo"}),  # omega 1, gamma 0.95, mean_norm: the official defaults
                # 48 GB a run at micro-batches of 8 in the pilot (3072-token rows, a value model beside the
                # policy): micro-batches of 2 cut the activations about 4x (same gradient, more passes)
                Arm(
                    "ppo",
                    {"algorithm": "ppo", "critic": "turn", "gamma": 0.95, "lam": 0.95, "micro_batch_rows": 2},
                    gpu_gb=30.0,
                ),
            ),
            baseline="grpo",
            gpu_gb=20.0,
            report=("collapse",),
            level_note="2 rooms, 12 receptacles, 3 distractors, task types two/clean/heat/cool: expert 7.9 turns "
            "(median 8, 90th percentile 10, 40 seeds); warm start 2048 x 2 measured at 0.27 held-out on H200 "
            "(benchmarks/results/papers_warmstart.md)",
            departures=(
                "SmolLM2-135M-Instruct after an SFT warm start (2048 expert episodes, 2 epochs; held-out 0.27) (GiGPO: Qwen2.5-1.5B/7B from the "
                "instruct model, no SFT)",
                "8 tasks x 8 rollouts a step, lr 1e-5 (GiGPO: 16 x 8, lr 1e-6), no KL term (GiGPO: KL 0.01)",
                "our Household-v0 (ALFWorld's six task types in text, generated layouts) at two rooms and four "
                "task types, 16 turns (ALFWorld: 50 turns)",
                "GiGPO's anchor states are exact world-state keys (info['state_key']), as its exact-match mode",
                "held-out = the `seen` split (held-out goals in training layouts), 64 greedy episodes",
            ),
        ),
        Claim(
            name="branching_chain",
            title="Branching at uncertain points (ARPO, APPO)",
            paper="ARPO (Dong et al. 2025): higher accuracy with about half the tool calls of trajectory-level "
            "RL; APPO: more solved tasks per generated token",
            env_id="toolgym/CalculatorChain-v0",
            env_kwargs=CHAIN,
            eval_env_kwargs={"split": "test"},
            sft={
                **SFT_BASE,
                "episodes": 128,
                "max_new_tokens": 48,
                "max_total_tokens": 1024,
                "env_kwargs": {**CHAIN, "num_ops": 2},
            },
            rl={
                **RL_BASE,
                "prompts_per_step": 16,
                "budget": 16,
                "lr": 2.0e-5,
                "max_new_tokens": 48,
                "max_total_tokens": 1024,
                "steps": 60,
            },
            arms=(
                Arm("grpo"),
                Arm("arpo", ARPO),
                Arm("appo", APPO),
            ),
            baseline="grpo",
            gpu_gb=10.0,
            report=("tool_calls",),
            level_note="2-3 operations; SFT on 128 two-operation chains (issue 23's calibration: 0.42 held-out "
            "after SFT on the 2-operation level)",
            departures=(
                "SmolLM2-135M-Instruct after a 128-episode SFT on two-operation chains (the papers: 7-8B models)",
                "tree advantages for both branching arms (ARPO's own code uses GRPO over its tree's leaves)",
                "APPO's likelihood gain is 1 in our rollout (no older policy to compare), so its forks go to "
                "the top-entropy tokens (branching.py, departure 6)",
            ),
        ),
        Claim(
            name="branching_search",
            title="Branching at uncertain points on multi-hop search (ARPO, APPO)",
            paper="ARPO (Dong et al. 2025, arXiv 2507.19849): on knowledge-intensive search (HotpotQA, 2Wiki, "
            "Musique, Bamboogle) higher accuracy than trajectory-level GRPO with about half the tool calls "
            "(Qwen2.5-3B/7B, Llama-3.1-8B); APPO: more solved tasks per generated token",
            env_id="toolgym/Search-v0",
            env_kwargs=SEARCH,
            eval_env_kwargs={},
            sft=SEARCH_SFT,
            rl=SEARCH_RL,
            arms=(Arm("grpo"), Arm("arpo", ARPO), Arm("appo", APPO)),
            baseline="grpo",
            gpu_gb=18.0,
            needs=("bm25s",),
            report=("tool_calls",),
            level_note="3 hops: the expert takes 4 turns (3 searches, the answer) with ~700 tokens of passages (40 "
            "seeds); its moves copy entity names from the question and the passages, as the calculator "
            "chain's do (128 SFT episodes gave 0.42 at two operations), but over three dependent hops and a "
            "longer context, so 4x the data (512 episodes, 32 optimizer steps); the first call's warm-start "
            "gate checks the 20-40% band before any RL",
            departures=(
                "SmolLM2-135M-Instruct after a 512-episode SFT on the expert's 3-hop episodes (ARPO: 3-8B "
                "instruct models after a cold-start SFT on its own 54k-sample set)",
                "our synthetic 10,000-passage world (invented names: no answer from pretraining), BM25 top 3 "
                "(ARPO: Wikipedia and web search; 2Wiki/HotpotQA/Musique questions)",
                "8 questions x 16 rollouts a step (ARPO's M = 16, N = 8), lr 1e-5, clip 0.2/0.28, 2 "
                "minibatches (ARPO: batch 128, mini-batch 16, lr 1e-6, clip 0.2/0.2, KL 0)",
                "tree advantages for both branching arms (ARPO's own code uses GRPO over its tree's leaves)",
                "APPO's likelihood gain is 1 in our rollout (no older policy), so its forks go to the "
                "top-entropy tokens (branching.py, departure 6)",
                "tool calls are read from the runs' metrics: `charts/tool_calls` x `rollout/episodes` summed "
                "to T* (calls spent in training, ARPO's count) and `eval/tool_calls` / `eval/success` at T* "
                "(calls a solved held-out question costs)",
            ),
        ),
        Claim(
            name="igpo_search",
            title="Information-gain turn rewards on multi-hop search (IGPO)",
            paper="IGPO (Wang et al. 2025, arXiv 2510.14967): turn rewards from the policy's gain in "
            "probability of the gold answer beat outcome-only GRPO on seven search QA sets (Qwen2.5-7B), the "
            "more so for small models and many turns",
            env_id="toolgym/Search-v0",
            env_kwargs=SEARCH,
            eval_env_kwargs={},
            sft=SEARCH_SFT,
            rl=SEARCH_RL,
            # IGPO's updated train.sh: log_prob_diff, separate normalisation, gamma 1 (the code's defaults,
            # the paper's form, are prob_diff / joint)
            arms=(
                Arm("grpo"),
                Arm("igpo", {"estimator": "igpo", "igpo_kind": "log_prob_diff", "igpo_norm": "separate"}),
            ),
            baseline="grpo",
            folder="branching_search",
            gpu_gb=18.0,
            needs=("bm25s",),
            report=("tool_calls",),
            level_note="the branching_search level and warm start (the same folder: its grpo runs are this "
            "claim's baseline)",
            departures=(
                "shares branching_search's warm start, setting and GRPO baseline runs",
                "the gold answer is the first of the question's aliases (`task.answer[0]`), rendered as "
                "`<answer>GOLD</answer>` after each turn's exact token prefix (trainers/igpo.py departures 1-2)",
                "the last turn's reward is exact match (IGPO: token F1), so the shared GRPO baseline's env "
                "is unchanged",
                "8 questions x 16 rollouts, lr 1e-5, no KL (IGPO's train.sh: lr 1e-6, KL 0.001, 10 turns)",
            ),
        ),
        Claim(
            name="replay_web",
            title="Experience replay and task selection for GUI agents (GUI-ARPO)",
            paper="ARPO for GUI agents (Lu et al. 2025, arXiv 2505.16282): replay of successful trajectories "
            "and selection of tasks the baseline solves sometimes lift UI-TARS-1.5-7B on OSWorld (83.9% on "
            "its in-domain 128-task subset vs 68.8% for GRPO, 29.9% on the full benchmark)",
            env_id="toolgym/Web-v0",
            env_kwargs=WEB,
            eval_env_kwargs={},
            sft={**SFT_BASE, "episodes": 256, "max_new_tokens": 32, "max_total_tokens": 2048},
            rl={**RL_BASE, "max_new_tokens": 32, "max_total_tokens": 2048, "steps": 60},
            arms=(
                Arm("grpo"),
                Arm("selection", {"task_pool": 64}),
                # ARPO's code: 8 successes kept per task, one replaces a rollout of an all-failed group
                Arm("replay", {"task_pool": 64, "replay": True, "replay_per_task": 8}),
            ),
            baseline="grpo",
            gpu_gb=14.0,
            needs=("chromium",),
            level_note="10 MiniWoB tasks whose scripted solvers take 1.8-3.0 turns on average, 4 at most (5 seeds "
            "each; 8-turn limit): "
            "after a short SFT (256 episodes, 16 steps) the one-click tasks are left out and the long "
            "calendars too, so the warm start solves some tasks sometimes; the warm-start gate checks the band",
            departures=(
                "SmolLM2-135M-Instruct on the text element list (ARPO: UI-TARS-1.5-7B on screenshots)",
                "MiniWoB++ in our Web-v0 (10 tasks, 64 task seeds in the pool) instead of OSWorld (128 tasks)",
                "task selection is online (a task all solved, or all failed with nothing buffered, rests 10 "
                "steps); ARPO filters its tasks once, offline, with the baseline agent",
                "replayed rows keep their behaviour logprobs: the is_mode weight corrects them (ARPO: none)",
                "8 tasks x 8 rollouts, lr 1e-5, minibatches 2 (ARPO: ppo_epochs 1 over its 32-task subset)",
                "an extra arm `selection` (task pool without replay) separates the two halves of the method",
            ),
        ),
        Claim(
            name="tir_stability",
            title="Stability of multi-turn tool-integrated reasoning (SimpleTIR void-turn filter, LLDS)",
            paper="SimpleTIR (Xue et al. 2025, arXiv 2509.02479): dropping trajectories with a void turn stops "
            "the gradient-norm explosions of multi-turn TIR and lifts AIME24 from 22.1 to 50.5 (Qwen2.5-7B); "
            "LLDS (arXiv 2512.04220): a likelihood-displacement penalty prevents Search-R1-style collapse",
            env_id="toolgym/PythonMath-v0",
            env_kwargs=PYTHON_MATH,
            eval_env_kwargs={},
            sft={**SFT_BASE, "episodes": 256, "max_new_tokens": 320, "max_total_tokens": 2048},
            # SimpleTIR's recipe: clip 0.2/0.2, temperature 1, at most 5 turns
            rl={**RL_BASE, "max_new_tokens": 320, "max_total_tokens": 2048, "steps": 60, "eps_high": 0.2},
            arms=(
                Arm("grpo"),
                Arm("void_filter", {"filter_void": True}),  # SimpleTIR: a void turn drops the trajectory
                Arm("llds", {"llds_coef": 0.2}),  # LLDS's lambda; acts with minibatches 2
            ),
            baseline="grpo",
            gpu_gb=18.0,
            needs=("bwrap",),
            report=("collapse",),
            level_note="difficulty 2: numbers too large for mental arithmetic, so the tool must run; the expert "
            "writes a 139-token program (292 at most) and boxes its output (2 turns); 256 SFT episodes "
            "teach the seven program templates; up to 5 turns leave room for retries and void turns",
            departures=(
                "SmolLM2-135M-Instruct after a 256-episode SFT (SimpleTIR: Qwen2.5-7B/32B from the base model, "
                "no SFT; LLDS: Search-R1's Qwen2.5-3B/7B)",
                "our PythonMath-v0 generator (exact arithmetic, primes, linear systems, series) instead of "
                "DAPO-Math-17k / AIME; the process sandbox (bubblewrap) instead of SimpleTIR's",
                "no acc_filter 0.1-0.9 (SimpleTIR's recipe has it; ours keeps only the zero-variance filter)",
                "8 problems x 8 rollouts, lr 1e-5, 60 steps: collapse in the papers comes after hundreds of "
                "steps at 7B; a 135M model may not collapse within our budget (then the arms tie)",
                "collapse events are counted from metrics.jsonl: a gradient-norm spike is a step whose "
                "`losses/grad_norm` exceeds 10x the median of the run's previous (up to 20) steps; entropy "
                "collapse is `losses/entropy` below 0.2x its median over the first 5 steps; a success "
                "collapse is the 5-step mean of `charts/success` falling below half its running max (>= 0.2)",
            ),
        ),
        Claim(
            name="epo_household",
            title="Entropy-regularised policy optimisation on the sparse-reward household task (EPO)",
            paper="EPO (Xu et al. 2025, arXiv 2509.22576): up to +152% on ScienceWorld and +19.8% on ALFWorld "
            "over PPO/GRPO-style baselines in sparse-reward multi-turn settings",
            env_id="toolgym/Household-v0",
            env_kwargs=HOUSEHOLD,
            eval_env_kwargs={"split": "seen"},
            sft=HOUSEHOLD_SFT,
            rl=HOUSEHOLD_RL,
            # alpha 0.001, beta 1, band 0.5/1.5 of the history mean, phase weight 0.1 -> 1.0: docs/trainer.md
            arms=(Arm("grpo"), Arm("epo", {"epo": True})),
            baseline="grpo",
            folder="gigpo_household",
            gpu_gb=20.0,
            report=("collapse",),
            level_note="the sparsest Household level with a warm start in the band: success is the only "
            "reward (subgoal_reward 0, the default), 2 rooms, >= 8 expert turns; harder levels (3-4 rooms) "
            "have no measured warm start",
            departures=(
                "shares gigpo_household's warm start, setting and GRPO baseline runs",
                "EPO's smoothing is a hinge (the official code's indicator has no gradient): docs/trainer.md",
                "one history value per step (the code keeps one per turn index)",
            ),
        ),
    )
}
