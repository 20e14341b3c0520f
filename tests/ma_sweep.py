"""A sweep of random multi-agent call sequences against RLlib 2.60: how many
agree (no Mismatch in ma_difftools.MATwin), and how many random episodes cut
and concatenated give back RLlib's uncut episode. test_multi_agent_episode_rllib
draws its sequences from here; to measure the agreement rate, run

    python tests/ma_sweep.py [N] [SEED]

Each sequence: a scenario's episode, stepped or built from constructor
lists (any lookback); maybe to_numpy(); maybe rebuilt by from_state() (of
the state or of the state sent through pickle) or unpickled; a few steps in
which a random subset of the acting agents gives extra model outputs (so an
agent may start giving them); then random getters and other calls (cut()
included), each compared. Each join: an episode's calls on RLlib's class
whole, and on ours cut at random steps (random lookbacks), each chunk
stepped on, then concatenated. Prints both agreement rates and the first
line of each disagreement.
"""
from __future__ import annotations

import collections
import copy
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hypothesis import strategies as st  # noqa: E402

import ma_strategies as mas  # noqa: E402
from ma_difftools import MATwin, Mismatch, compare_joined_with_whole  # noqa: E402


def restored(twin: MATwin, how: str):
    """Both episodes rebuilt; None where RLlib's rebuild fails."""
    try:
        if how == "pickle":
            theirs = pickle.loads(pickle.dumps(twin.theirs, protocol=5))
        else:
            state = twin.theirs.get_state()
            state = pickle.loads(pickle.dumps(state)) if how == "state_pickle" \
                else copy.deepcopy(state)
            theirs = twin.Rllib.from_state(state)
    except Exception:  # noqa: BLE001 - RLlib's own rebuild crashed
        return None
    if how == "pickle":
        ours = pickle.loads(pickle.dumps(twin.ours, protocol=5))
    else:
        state = twin.ours.get_state()
        state = pickle.loads(pickle.dumps(state)) if how == "state_pickle" \
            else copy.deepcopy(state)
        ours = twin.Ours.from_state(state)
    new = twin.child(ours, theirs)
    new.history.append(f"{how} round trip")
    new.check_state(how)
    return new


def sequence(draw) -> str:
    """One sequence; "ok", "skip" or the disagreement."""
    ep = draw(mas.episodes(invalid=False, max_steps=5))
    sc = ep.scenario
    kwargs = sc.constructor_kwargs("ep")
    if draw(st.booleans()):
        kwargs.update(mas.as_constructor_data(ep))
        kwargs["len_lookback_buffer"] = draw(st.sampled_from(["auto", 0, 1, 2]))
        twin = MATwin.new(**kwargs)
    else:
        twin = MATwin.new(**kwargs)
        if twin is not None:
            for name, args, kw in ep.calls:
                twin.call(name, *args, **kw)
                if twin.diverged:
                    return "ok"
    if twin is None:
        return "skip"
    if draw(st.booleans()):
        twin.call("to_numpy")
    how = draw(st.sampled_from([None, "from_state", "state_pickle", "pickle"]))
    if how and not twin.diverged:
        twin = restored(twin, how)
        if twin is None:
            return "skip"
    some = copy.copy(sc)
    some.extras = sc.extras or ("action_logp",)
    for _ in range(draw(st.integers(0, 4))):
        if twin.diverged or twin.theirs.is_done or not twin.theirs.is_reset:
            break
        some.extras_agents = draw(st.lists(st.sampled_from(sc.agents), unique=True))
        states = mas.agent_states(twin.theirs, sc.agents)
        call, _ = draw(mas.env_step(some, states, mas.stepped_agents(twin.theirs),
                                    mas.output_agents(twin.theirs)))
        twin.call(call[0], *call[1], **call[2])
    keys = some.extras + ("missing",)
    for _ in range(8):
        if twin.diverged:
            break
        name, args, kw = draw(st.one_of(
            mas.calls(sc.agents, keys),
            mas.getter_call(sc.agents, keys, name="get_extra_model_outputs")))
        twin.call(name, *args, **kw)
    return "ok"


def join(draw) -> str:
    """One episode cut and concatenated; "ok", "skip" or the disagreement."""
    from episode import MultiAgentEpisode
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as Rllib

    ep = draw(mas.episodes(invalid=False, max_steps=10))
    cuts = draw(mas.cut_points(ep))
    try:
        whole, _ = mas.play_in_chunks(Rllib, ep, {})
    except Exception:  # noqa: BLE001 - histories RLlib cannot step are not compared
        return "skip"
    try:
        _, joined = mas.play_in_chunks(MultiAgentEpisode, ep, cuts)
    except Exception as e:  # noqa: BLE001 - a chunked history ours cannot step or join
        raise Mismatch(f"ours raised {e!r} on {cuts}") from e
    compare_joined_with_whole(joined, whole)
    return "ok"


def rate(label: str, results: list) -> None:
    """Prints the agreement rate and each disagreement's count."""
    counts = collections.Counter("mismatch" if r.startswith("MISMATCH") else r
                                 for r in results)
    agree = len(results) - counts["mismatch"]
    print(f"{label}: {agree}/{len(results)} agree ({100 * agree / len(results):.1f}%); "
          f"{dict(counts)}")
    for line, k in collections.Counter(r for r in results if r.startswith("MISMATCH")
                                       ).most_common():
        print(" ", k, line)


def main(n: int, seed: int) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded

    for label, one in (("sequences", sequence), ("cut/concat joins", join)):
        results = []

        @seeded(seed)
        @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def run(data):
            try:
                results.append(one(data.draw))
            except Mismatch as e:
                results.append("MISMATCH " + str(e).split("\n")[0][:200])

        run()
        rate(label, results)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400,
         int(sys.argv[2]) if len(sys.argv) > 2 else 0)
