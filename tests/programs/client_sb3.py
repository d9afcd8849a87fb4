"""wandb's documented Stable-Baselines3 integration, as a user writes it: PPO on gymnasium's
CartPole-v1 logs through SB3's own logger into tensorboard (``tensorboard_log=``), and
``wandb.init(sync_tensorboard=True)`` brings the events into the run. Nothing is downloaded.

Plain wandb code (run under ``wandb-funnel run --`` unchanged).
"""

from __future__ import annotations

import torch
import wandb
from stable_baselines3 import PPO


def main() -> None:
    torch.set_num_threads(1)  # the same numbers in every run
    config = {"policy_type": "MlpPolicy", "total_timesteps": 256, "env_id": "CartPole-v1"}
    run = wandb.init(project="sb3", name="ppo-cartpole", config=config, sync_tensorboard=True)
    model = PPO(
        config["policy_type"], config["env_id"], n_steps=64, batch_size=32, n_epochs=2,
        seed=0, device="cpu", verbose=0, tensorboard_log=f"tb/{run.id}",
    )
    model.learn(total_timesteps=config["total_timesteps"])
    run.finish()


if __name__ == "__main__":
    main()
