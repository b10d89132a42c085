"""The household family: ALFWorld-style tasks in a fast pure-Python world of rooms, receptacles and objects."""

ENVS = {"toolgym/Household-v0": "toolgym.envs.household.env:HouseholdEnv"}
