"""Data shipped with the rewards: the judge's labelled calibration set and its injection set
(``toolgym.rewards.judge_calibration`` reads them)."""
