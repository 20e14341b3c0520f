"""Coverage-guided fuzzing (atheris) of the C decoder of RLlib's packed
episodes (episode._msgpack), the one hand-written parser kept for RLlib's
formats. Every input must give episodes or raise ValueError, TypeError or
AssertionError (RLlib's, for tracks of inconsistent lengths); a crash, a
sanitizer report or any other exception is a finding.

    python tests/fuzz/fuzz_msgpack.py -atheris_runs=20000 [corpus folders]

The seeds (packed episodes of the layouts the decoder reads fast: list mode
and numpy'd tracks, Dict observations, images, infos, extra model outputs)
are written into a fresh folder, given first. .ci/sanitize runs it on the
ASan+UBSan build; atheris follows the coverage of the Python code the
decoder calls (its general path: from_state, the spaces).
"""
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["episode"]):
    import gymnasium as gym
    import numpy as np

    from episode import SingleAgentEpisode
    from episode import _msgpack
    from episode.offline import rllib_format


def seed_episodes() -> list:
    """A few episodes of each layout the decoder reads."""
    rng = np.random.default_rng(0)
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    image = gym.spaces.Box(0, 255, (6, 6, 1), np.uint8)
    nested = gym.spaces.Dict({"a": box, "b": gym.spaces.Discrete(4)})
    out = []
    for space, action_space in ((box, gym.spaces.Discrete(2)), (image, gym.spaces.Discrete(3)),
                                (nested, box), (None, None)):
        for steps, numpy in ((0, False), (3, False), (5, True)):
            first = space.sample() if space is not None else 0
            ep = SingleAgentEpisode(observations=[first], infos=[{"k": 1}],
                                    observation_space=space, action_space=action_space,
                                    len_lookback_buffer=0)
            for t in range(steps):
                ep.add_env_step(space.sample() if space is not None else t,
                                action_space.sample() if action_space is not None
                                else np.int64(t), float(rng.random()), infos={} if t else {"t": t},
                                terminated=t == steps - 1,
                                extra_model_outputs={"logp": np.float32(t)})
            if numpy:
                ep.to_numpy()
            out.append(ep)
    return out


def test_one_input(data: bytes) -> None:
    try:
        _msgpack.unpack_episode(data, SingleAgentEpisode)
    except (ValueError, TypeError, AssertionError):
        pass
    # The same bytes as an Arrow column's data: two values, split in the middle.
    offsets = np.array([0, len(data) // 2, len(data)], dtype=np.int64)
    try:
        _msgpack.unpack_episodes_arrow(data, offsets, SingleAgentEpisode)
    except (ValueError, TypeError, AssertionError):
        pass


def main() -> None:
    seeds = tempfile.mkdtemp(prefix="fuzz-msgpack-seeds-")
    for i, blob in enumerate(rllib_format.pack_episodes(seed_episodes())):
        with open(os.path.join(seeds, f"seed-{i:02d}"), "wb") as f:
            f.write(blob)
    atheris.Setup(sys.argv + [seeds], test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
