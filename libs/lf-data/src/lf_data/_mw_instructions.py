"""One English instruction per Meta-World v3 task (Meta-World itself has none).

Written from the task descriptions of Yu et al., "Meta-World: A Benchmark and
Evaluation for Multi-Task and Meta Reinforcement Learning" (CoRL 2019), Table 2.
"""

from __future__ import annotations

METAWORLD_INSTRUCTIONS: dict[str, str] = {
    "assembly-v3": "pick up the nut and place it onto the peg",
    "basketball-v3": "dunk the basketball into the basket",
    "bin-picking-v3": "pick the puck from one bin and place it into the other bin",
    "box-close-v3": "grasp the lid and close the box with it",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "bypass the wall and press the button from the top",
    "button-press-v3": "press the button",
    "button-press-wall-v3": "bypass the wall and press the button",
    "coffee-button-v3": "push the button on the coffee machine",
    "coffee-pull-v3": "pull the mug out of the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "rotate the dial half a turn",
    "disassemble-v3": "pick the nut off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door by turning the lock",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door by turning the lock",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-close-v3": "turn the faucet clockwise to close it",
    "faucet-open-v3": "turn the faucet counter-clockwise to open it",
    "hammer-v3": "hammer the nail into the wall",
    "hand-insert-v3": "insert the gripper into the hole",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "peg-insert-side-v3": "insert the peg sideways into the hole",
    "peg-unplug-side-v3": "unplug the peg sideways",
    "pick-out-of-hole-v3": "pick the puck out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "pick-place-wall-v3": "pick up the puck, bypass the wall and place it at the goal",
    "plate-slide-back-side-v3": "slide the plate sideways out of the cabinet",
    "plate-slide-back-v3": "slide the plate back out of the cabinet",
    "plate-slide-side-v3": "slide the plate sideways into the cabinet",
    "plate-slide-v3": "slide the plate into the cabinet",
    "push-back-v3": "pull the puck back to the goal",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "reach-v3": "reach the red goal position",
    "reach-wall-v3": "reach over the wall to the red goal position",
    "shelf-place-v3": "pick up the puck and place it onto the shelf",
    "soccer-v3": "kick the ball into the goal",
    "stick-pull-v3": "grasp the stick and pull the box with it",
    "stick-push-v3": "grasp the stick and push the box with it",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-close-v3": "slide the window closed",
    "window-open-v3": "slide the window open",
}


def instruction_for(task: str) -> str:
    """The instruction of ``task``; ValueError listing the known tasks otherwise."""
    try:
        return METAWORLD_INSTRUCTIONS[task]
    except (KeyError, TypeError):
        raise ValueError(f"unknown Meta-World task {task!r}; known tasks: {sorted(METAWORLD_INSTRUCTIONS)}") from None
