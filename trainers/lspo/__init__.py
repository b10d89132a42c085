"""LSPO (Xu et al. 2025): latent strategy space (``space``), the abstracted Werewolf game (``game``), CFR
(``cfr``, tested on Kuhn poker: ``kuhn``), and the iteration that turns the solver's strategy into DPO pairs
(``loop``). docs/trainer.md has the formulas and our departures."""
