"""`Episode`: a finished trajectory (whole, or the summary a run's driver holds) as the training
stages read it, one view for all of them: routing (`routing.reference.RoutableTrajectory`, the
matchers' `RouteTrace`, the teacher's state summary and reference observations) and UniSkill's
candidate selection (`rollout_workers.proposer.GroupMember`). Read-only; the env's tracker comes from
`routing.trackers`, its prompt view from `rollout_workers.env_profiles`.

The live episode the rollout loop mutates turn by turn is a different thing (`loop._LiveEpisode`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout_workers.env_profiles import rollout_profile
from rollout_workers.types import AnyTrajectory
from routing.matching import RouteTrace
from routing.trackers import tracker_profile
from routing.types import TrackedEpisode


@dataclass(frozen=True)
class Episode:
    """Executed actions, the observation before each of them plus the final one, and the ids and
    outcome routing and candidate selection group and pair trajectories by."""

    traj: AnyTrajectory

    @property
    def task_id(self) -> str:
        return self.traj.task.task_id

    @property
    def traj_id(self) -> str:
        return self.traj.traj_id

    @property
    def group_id(self) -> str:
        return self.traj.group_id

    @property
    def success(self) -> bool:
        return self.traj.success

    @property
    def won(self) -> bool:
        """`success` under the name candidate selection uses."""
        return self.traj.success

    @property
    def actions(self) -> list[str]:
        return [t.env_action for t in self.traj.turns]

    @property
    def observations(self) -> list[str]:
        turns = self.traj.turns
        return [t.observation for t in turns] + ([turns[-1].next_observation] if turns else [])

    @property
    def task_text(self) -> str:
        """The prompt's task line (as the loop read it from the reset observation)."""
        return rollout_profile(self.traj.task.env).task_text(
            self.traj.task, self.traj.turns[0].observation if self.traj.turns else "")

    def tracked(self) -> TrackedEpisode:
        """What the env's state tracker reads (the admissible actions shown at each turn too)."""
        task = self.traj.task
        return TrackedEpisode(task_id=task.task_id, task_type=task.task_type, instruction=task.instruction,
                              observations=self.observations, actions=self.actions,
                              admissible=[t.admissible_actions for t in self.traj.turns])

    def trace(self) -> RouteTrace:
        """Actions, observations, and the env tracker's exact signature and held instance of every
        observation."""
        profile, tracked = tracker_profile(self.traj.task.env), self.tracked()
        return RouteTrace(actions=self.actions, observations=self.observations,
                          signatures=profile.signatures(tracked), held=profile.held(tracked))

    def state_fields(self, t: int, trace: RouteTrace) -> dict[str, str]:
        """The teacher's state summary at turn t (the env tracker's summary fields)."""
        return tracker_profile(self.traj.task.env).state_summary(self.tracked(), t, trace.signatures)

    def shown_observations(self) -> list[str]:
        """Observations before each action as prompts show them (WebShop: verl-agent's format)."""
        fmt = rollout_profile(self.traj.task.env).format_observation
        task = self.task_text
        return [fmt(o, task) for o in self.observations[:-1]]
