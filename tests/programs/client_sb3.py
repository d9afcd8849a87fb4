"""wandb's documented Stable-Baselines3 integration, as a user writes it: PPO on gymnasium's
CartPole-v1 logs through SB3's own logger into tensorboard (``tensorboard_log=``), and
``wandb.init(sync_tensorboard=True)`` brings the events into the run. Nothing is downloaded.

``--callback`` adds wandb's ``WandbCallback`` as its docs show it: gradient histograms every
``gradient_save_freq`` steps (``wandb.watch``, logged with ``commit=False`` by a process that
never commits a row itself) and the model saved with ``wandb.save(..., base_path=)``.

Plain wandb code (run under ``wandb-funnel run --`` unchanged).
"""

from __future__ import annotations

import sys

import torch
import wandb
from stable_baselines3 import PPO


def main() -> None:
    torch.set_num_threads(1)  # the same numbers in every run
    policy, env_id, timesteps = "MlpPolicy", "CartPole-v1", 256
    config = {"policy_type": policy, "total_timesteps": timesteps, "env_id": env_id}
    run = wandb.init(project="sb3", name="ppo-cartpole", config=config, sync_tensorboard=True)
    model = PPO(
        policy,
        env_id,
        n_steps=64,
        batch_size=32,
        n_epochs=2,
        seed=0,
        device="cpu",
        verbose=0,
        tensorboard_log=f"runs/{run.id}",
    )
    callback = None
    if "--callback" in sys.argv:
        from wandb.integration.sb3 import WandbCallback

        callback = WandbCallback(gradient_save_freq=4, model_save_path=f"models/{run.id}")
    model.learn(total_timesteps=timesteps, callback=callback)
    run.finish()


if __name__ == "__main__":
    main()
