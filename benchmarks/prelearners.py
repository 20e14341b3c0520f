"""The OfflinePreLearner the offline benchmarks time: RLlib's and ours, built
from the same BC config."""
import gymnasium as gym


def bc_prelearner(side: str, kind: str, **offline_data):
    """A BC config's OfflinePreLearner for CartPole (train batch 1024) reading
    RLlib's `kind` format ("episodes" or "rows"): RLlib's for side "rllib",
    ours otherwise. `offline_data`: more of offline_data()'s arguments."""
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.env import INPUT_ENV_SPACES

    env = gym.make("CartPole-v1")
    config = (BCConfig()
              .environment(observation_space=env.observation_space,
                           action_space=env.action_space)
              .training(train_batch_size_per_learner=1024)
              .offline_data(input_read_episodes=kind == "episodes",
                            dataset_num_iters_per_learner=1, **offline_data))
    spaces = {INPUT_ENV_SPACES: (env.observation_space, env.action_space),
              "default_policy": (env.observation_space, env.action_space)}
    spec = config.get_multi_rl_module_spec(spaces=spaces, inference_only=False)
    if side == "rllib":
        from ray.rllib.offline.offline_prelearner import OfflinePreLearner
    else:
        from episode.rllib.offline import OfflinePreLearner
    return OfflinePreLearner(config=config, spaces=spaces[INPUT_ENV_SPACES], module_spec=spec)
