"""Multi-agent text games: the turn-based API (``api``) and the single-agent seat env over it (``seat``)."""
