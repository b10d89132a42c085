"""One Calculator-v0 episode played by the scripted expert, printed message by message."""

import gymnasium as gym

import toolgym  # noqa: F401  (registers the toolgym/ ids)
from toolgym.envs.base import tool_env

env = gym.make("toolgym/Calculator-v0")
obs, info = env.reset(seed=3)
for message in obs:
    print(f"[{message['role']}] {message['content']}")
done = False
while not done:
    action = tool_env(env).expert_action()
    print(f"[assistant] {action}")
    obs, reward, terminated, truncated, info = env.step(action)
    for message in obs:
        print(f"[{message['role']}] {message['content']}")
    done = terminated or truncated
print(f"success={info['success']} reward={info['episode_reward']} parts={info['episode_reward_components']}")
env.close()
