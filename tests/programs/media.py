"""Media through the funnel: wandb's own objects and the light types, from the owner and from
other ranks, compared with plain wandb logging the same objects.

    python media.py SCENARIO [options]      (``--help`` lists them)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
import wave
from typing import Any

import numpy as np
from _prelude import Scenarios, option, report

scenario = Scenarios(__doc__)
plain = option("--plain", action="store_true", help="plain wandb in this process, no funnel")
mode = option("--run-mode", choices=["auto", "shared"], default="auto")


def pixels(seed: int, shape: tuple[int, ...] = (16, 16, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def write_media_files(directory: str) -> dict[str, str]:
    """A PNG, a WAV and a GIF made here (nothing downloaded)."""
    from PIL import Image as PILImage

    png = os.path.join(directory, "picture.png")
    PILImage.fromarray(pixels(7)).save(png)
    wav = os.path.join(directory, "tone.wav")
    with wave.open(wav, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        tone = (np.sin(np.arange(800) / 5.0) * 2000).astype(np.int16)
        w.writeframes(tone.tobytes())
    gif = os.path.join(directory, "clip.gif")
    frames = [PILImage.fromarray(pixels(i)) for i in range(3)]
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=100)
    return {"png": png, "wav": wav, "gif": gif}


def wandb_objects(wandb: Any, files: dict[str, str]) -> dict[str, Any]:
    """One of each: what the issue names, as plain wandb code builds them."""
    boxes = {
        "predictions": {
            "box_data": [
                {
                    "position": {"minX": 0.1, "maxX": 0.5, "minY": 0.2, "maxY": 0.6},
                    "class_id": 1,
                    "box_caption": "cat",
                    "scores": {"acc": 0.75},
                }
            ],
            "class_labels": {0: "background", 1: "cat"},
        }
    }
    masks = {
        "segmentation": {
            "mask_data": (pixels(3, (16, 16)) % 2).astype(np.uint8),
            "class_labels": {0: "background", 1: "cat"},
        }
    }
    table = wandb.Table(columns=["id", "image", "guess", "score"])
    for i in range(3):
        table.add_data(i, wandb.Image(pixels(10 + i), caption=f"item {i}"), i % 2, 0.25 * i)
    points = wandb.Table(columns=["x", "y"], data=[[x, x * x] for x in range(5)])
    return {
        "image": wandb.Image(pixels(1), caption="an array", boxes=boxes, masks=masks),
        "image_path": wandb.Image(files["png"], caption="a file"),
        "images": [wandb.Image(pixels(20 + i)) for i in range(2)],
        "table": table,
        "hist": wandb.Histogram([0.1, 0.2, 0.2, 0.9], num_bins=4),
        "hist_np": wandb.Histogram(np_histogram=([1, 2, 3], [0.0, 1.0, 2.0, 3.0])),
        "html": wandb.Html("<b>hello</b>"),
        "audio": wandb.Audio(files["wav"], caption="a tone"),
        "video": wandb.Video(files["gif"], caption="a clip"),
        "line": wandb.plot.line(points, "x", "y", title="line"),
        "scatter": wandb.plot.scatter(points, "x", "y", title="scatter"),
        "bar": wandb.plot.bar(points, "x", "y", title="bar"),
        "histogram_chart": wandb.plot.histogram(points, "y", title="histogram"),
        "confusion": wandb.plot.confusion_matrix(
            y_true=[0, 1, 1, 0], preds=[0, 1, 0, 0], class_names=["a", "b"]
        ),
        "loss": 0.5,
    }


@scenario(plain)
def wandb_objects_run(args: argparse.Namespace) -> None:
    """Plain wandb code logging every media kind, through install() or (--plain) not."""
    if not args.plain:
        import wandb_funnel

        wandb_funnel.install()
    import wandb

    run = wandb.init(project="media", name="media-run")
    files = write_media_files(run.dir if args.plain else os.environ["MEDIA_SCRATCH"])
    run.log(wandb_objects(wandb, files))
    run.log({"loss": 0.25})
    wandb.finish()


def light_objects(wf: Any, files: dict[str, str]) -> dict[str, Any]:
    """The same data as the light types (``wf``) or wandb's classes take it."""
    table = wf.Table(columns=["id", "image", "guess"])
    for i in range(3):
        table.add_data(i, wf.Image(pixels(10 + i), caption=f"item {i}"), i % 2)
    return {
        "image": wf.Image(pixels(1), caption="an array"),
        "image_gray": wf.Image(pixels(2, (12, 12))),
        "image_path": wf.Image(files["png"]),
        "table": table,
        "hist": wf.Histogram([0.1, 0.2, 0.2, 0.9], num_bins=4),
        "hist_np": wf.Histogram(np_histogram=([1, 2, 3], [0.0, 1.0, 2.0, 3.0])),
    }


@scenario(plain)
def light_types(args: argparse.Namespace) -> None:
    """wf.Image / wf.Histogram / wf.Table through wf.init, or (--plain) wandb's classes with
    the same data in plain wandb."""
    if args.plain:
        import wandb

        run: Any = wandb.init(project="media", name="light")
        files = write_media_files(os.environ["MEDIA_SCRATCH"])
        run.log(light_objects(wandb, files))
        run.finish()
        return
    import wandb_funnel as wf

    run = wf.init(project="media", name="light")
    files = write_media_files(os.environ["MEDIA_SCRATCH"])
    run.log(light_objects(wf, files))
    wf.finish()


def light_rank(run: Any, steps: int, barrier: Any) -> None:
    """A rank that only uses the light types: it must never import wandb."""
    import wandb_funnel as wf

    run._attach(30)  # attached before anyone logs, so every rank's step 0 lands in one row
    rank = run.rank  # the funnel's number for this process (ranks attach in any order)
    barrier.wait(60)
    for step in range(steps):
        table = wf.Table(columns=["id", "image", "guess"])
        for i in range(2):
            table.add_data(rank * 10 + i, wf.Image(pixels(rank * 100 + i)), (rank + i) % 3)
        run.log(
            {
                "preds": table,
                "sample": wf.Image(pixels(rank), caption=f"rank {rank}"),
                "hist": wf.Histogram(np_histogram=([rank, 1, 2], [0.0, 1.0, 2.0, 3.0])),
                "loss": float(rank),
            },
            step=step,
        )
    report(rank=rank, wandb_in_rank="wandb" in sys.modules)
    run.finish()


@scenario(mode, option("--steps", type=int, default=2))
def ranks(args: argparse.Namespace) -> None:
    """Two spawned ranks and the owner log a table, an image and a histogram at each step;
    tables concatenate and histograms merge."""
    import wandb_funnel as wf

    reduce = {"preds": "concat", "hist": "merge"}
    # Every rank attaches before anyone logs, so rows wait for all three; the window only
    # bounds a straggler. Under load a spawned rank's first wf.Image (PIL's import) took
    # longer than the default window, and its records came late: not what is tested here.
    with wf.Funnel(
        project="media", run_mode=args.run_mode, reduce=reduce, reorder_window=60
    ) as funnel:
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(3)
        procs = [
            ctx.Process(target=light_rank, args=(funnel.run, args.steps, barrier)) for _ in range(2)
        ]
        for p in procs:
            p.start()
        # The owner's rank too: unattached, it held no row, and the workers' step 0 could be
        # written before its records came (counted late; seen once in CI under load).
        funnel.run._attach(30)
        barrier.wait(60)
        light_rank_owner(funnel.run, args.steps)
        for p in procs:
            p.join(60)
        report(staging=os.path.join(os.path.dirname(funnel.address[len("ipc://") :]), "media"))
    report(stats=funnel.stats, exit_codes=[p.exitcode for p in procs])


def light_rank_owner(run: Any, steps: int) -> None:
    import wandb_funnel as wf

    for step in range(steps):
        table = wf.Table(columns=["id", "image", "guess"], data=[[0, wf.Image(pixels(0)), 0]])
        run.log(
            {
                "preds": table,
                "sample": wf.Image(pixels(0), caption="rank 0"),
                "hist": wf.Histogram(np_histogram=([0, 1, 2], [0.0, 1.0, 2.0, 3.0])),
                "loss": 0.0,
            },
            step=step,
        )


def flood(run: Any, ready: Any) -> None:
    """Log images as fast as possible until killed."""
    import wandb_funnel as wf

    image = wf.Image(pixels(5, (64, 64, 3)))
    step = 0
    while True:
        run.log({"img": image, "n": step}, step=step)
        step += 1
        if step == 20:
            ready.set()


@scenario(
    option("--kill", choices=["rank", "logger"], required=True),
    option("--max-restarts", type=int, default=3),
)
def killed(args: argparse.Namespace) -> None:
    """A rank logging images is SIGKILLed mid-flood, or the logger is, with media in flight:
    the funnel still closes, and nothing stays staged."""
    import wandb_funnel as wf

    funnel = wf.Funnel(project="media", close_timeout=20, max_logger_restarts=args.max_restarts)
    funnel.start()
    staging = os.path.join(os.path.dirname(funnel.address[len("ipc://") :]), "media")
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=flood, args=(funnel.run, ready))
    proc.start()
    ready.wait(60)
    time.sleep(0.3)
    staged_before = len(os.listdir(staging)) if os.path.isdir(staging) else 0
    if args.kill == "rank":
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
    else:
        assert funnel.logger_pid is not None
        os.kill(funnel.logger_pid, signal.SIGKILL)
        time.sleep(0.5)
        proc.kill()
    proc.join(30)
    funnel.run.log({"after": 1}, step=10**6)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        funnel.close()
    report(
        staging=staging,
        staging_left=os.path.exists(staging),
        staged_before=staged_before,
        stats=funnel.stats,
        run_id=funnel.run_id,
    )


def train_watched(wandb: Any) -> None:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    wandb.watch(model, log="all", log_freq=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        wandb.log({"loss": loss.item()})


def log_files(wandb: Any, run: Any, scratch: str, tag: str) -> None:
    """A directory and a wandb.Artifact as artifacts, and a file saved into the run."""
    data = os.path.join(scratch, f"data-{tag}")
    os.makedirs(os.path.join(data, "sub"), exist_ok=True)
    for name, text in (("a.txt", "a"), ("sub/b.txt", "b")):
        with open(os.path.join(data, name), "w") as f:
            f.write(f"{text} from {tag}")
    run.log_artifact(data, name=f"dataset-{tag}", type="dataset")
    artifact = wandb.Artifact(f"model-{tag}", type="model", metadata={"tag": tag})
    artifact.add_file(os.path.join(data, "a.txt"), name="weights.txt")
    run.log_artifact(artifact, aliases=["best"])
    checkpoints = os.path.join(scratch, f"ck-{tag}")
    os.makedirs(checkpoints, exist_ok=True)
    with open(os.path.join(checkpoints, "w.bin"), "w") as f:
        f.write(f"weights of {tag}")
    wandb.save(os.path.join(checkpoints, "*.bin"), base_path=scratch)


def files_child(scratch: str) -> None:
    import wandb  # installed: the parent's install() holds in this spawned child

    run = wandb.init()
    log_files(wandb, run, scratch, "child")
    wandb.finish()


@scenario(plain)
def files_and_watch(args: argparse.Namespace) -> None:
    """wandb.watch, run.log_artifact (a directory, a wandb.Artifact) and wandb.save, through
    install() or (--plain) not; through the funnel a spawned child logs its own files too."""
    if not args.plain:
        import wandb_funnel

        wandb_funnel.install()
    import wandb

    scratch = os.environ["MEDIA_SCRATCH"]
    run = wandb.init(project="media", name="files")
    train_watched(wandb)
    log_files(wandb, run, scratch, "owner")
    if not args.plain:
        child = mp.get_context("spawn").Process(target=files_child, args=(scratch,))
        child.start()
        child.join(120)
        report(child_exit=child.exitcode)
    wandb.finish()


if __name__ == "__main__":
    scenario.main()
