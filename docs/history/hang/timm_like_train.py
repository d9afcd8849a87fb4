"""A stand-in for timm's train.py (issue 23, item 5), written here: timm's train.py is not in
its wheel. It uses timm's own training utilities in train.py's order and with train.py's
calls, on CPU/gloo, with nothing downloaded:

    utils.init_distributed_device (gloo on cpu) -> create_model (no pretrained weights) ->
    resolve_data_config -> create_optimizer_v2 -> DDP -> create_dataset/create_loader on an
    image folder (prefetcher on, --workers DataLoader workers per rank) -> wandb.init on the
    primary rank only (train.py's --log-wandb) -> create_scheduler_v2 -> epochs of
    train_one_epoch (reduce_tensor of the loss) and validate (reduce_tensor of loss/acc) ->
    utils.update_summary(log_wandb=True) and a CheckpointSaver on the primary rank.

Like train.py, it neither calls wandb.finish() nor destroy_process_group(): main() returns and
the interpreter exits (``--destroy`` adds destroy_process_group() for comparison).

    python timm_like_train.py DATA_DIR [--make-data] [--epochs 2] [--workers 2]
"""

import argparse
import logging
import os
import time
from collections import OrderedDict

import torch

# PyPI's torchvision 0.28.0 wheel is a CUDA build: with the CPU torch the tests pin, its _C
# extension does not load and its import fails on registering fakes for ops that do not
# exist. Defining the two schemas lets torchvision (and so timm) import; no nms is called here.
for _op in ("nms", "qnms"):
    try:
        torch.library.define(f"torchvision::{_op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # already defined: a torchvision whose ops load
        pass

from torch.nn.parallel import DistributedDataParallel as NativeDDP  # noqa: E402

from timm import utils  # noqa: E402
from timm.data import create_dataset, create_loader, resolve_data_config  # noqa: E402
from timm.loss import LabelSmoothingCrossEntropy  # noqa: E402
from timm.models import create_model  # noqa: E402
from timm.optim import create_optimizer_v2  # noqa: E402
from timm.scheduler import create_scheduler_v2  # noqa: E402

try:
    import wandb

    has_wandb = True
except ImportError:
    has_wandb = False

_logger = logging.getLogger("train")


def make_data(root: str, classes: int = 4, per_class: int = 16, size: int = 32) -> None:
    """A tiny ImageFolder: train/ and validation/, PNGs of random pixels per class."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("validation", per_class // 2)):
        for c in range(classes):
            d = os.path.join(root, split, f"class{c}")
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                px = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                px[..., c % 3] = 40 * c  # something a model can learn
                Image.fromarray(px).save(os.path.join(d, f"{i}.png"))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("data_dir")
    p.add_argument("--make-data", action="store_true")
    p.add_argument("--model", default="resnet10t")
    p.add_argument("--num-classes", type=int, default=4)
    p.add_argument("--input-size", type=int, nargs=3, default=[3, 32, 32])
    p.add_argument("-b", "--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-interval", type=int, default=2)
    p.add_argument("--experiment", default="timm-hang")
    p.add_argument("--output", default="./output/train")
    p.add_argument("--log-wandb", action="store_true")
    p.add_argument("--destroy", action="store_true", help="destroy_process_group() at the end")
    p.add_argument("--rank0-linger", type=float, default=0.0,
                   help="diagnosis: rank 0 sleeps this long in an exit hook (a slow run close)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="cpu")
    return p.parse_args()


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, lr_scheduler):
    losses_m = utils.AverageMeter()
    model.train()
    num_updates = epoch * len(loader)
    for batch_idx, (input, target) in enumerate(loader):
        loss = loss_fn(model(input), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        num_updates += 1
        if batch_idx == len(loader) - 1 or batch_idx % args.log_interval == 0:
            reduced = utils.reduce_tensor(loss.data, args.world_size) if args.distributed else loss.data
            losses_m.update(reduced.item(), input.size(0))
            if utils.is_primary(args):
                _logger.info(f"Train: {epoch} [{batch_idx}/{len(loader)}] Loss: {losses_m.val:#.4g}")
        lr_scheduler.step_update(num_updates=num_updates, metric=losses_m.avg)
    return OrderedDict([("loss", losses_m.avg)])


def validate(model, loader, loss_fn, args):
    losses_m, top1_m = utils.AverageMeter(), utils.AverageMeter()
    model.eval()
    with torch.no_grad():
        for input, target in loader:
            output = model(input)
            loss = loss_fn(output, target)
            acc1, _ = utils.accuracy(output, target, topk=(1, 2))
            if args.distributed:
                loss = utils.reduce_tensor(loss.data, args.world_size)
                acc1 = utils.reduce_tensor(acc1, args.world_size)
            losses_m.update(loss.item(), input.size(0))
            top1_m.update(acc1.item(), output.size(0))
    return OrderedDict([("loss", losses_m.avg), ("top1", top1_m.avg)])


def main() -> None:
    utils.setup_default_logging()
    args = parse()
    if args.make_data:
        make_data(args.data_dir)
        return
    device = utils.init_distributed_device(args)
    if args.rank0_linger and args.rank == 0:
        import atexit

        atexit.register(time.sleep, args.rank0_linger)  # registered first: runs last
    utils.random_seed(args.seed, args.rank)
    model = create_model(args.model, pretrained=False, num_classes=args.num_classes)
    data_config = resolve_data_config(vars(args), model=model, verbose=utils.is_primary(args))
    model.to(device=device)
    optimizer = create_optimizer_v2(model, opt="sgd", lr=args.lr, weight_decay=2e-5, momentum=0.9)
    if args.distributed:
        model = NativeDDP(model)
    dataset_train = create_dataset("", root=args.data_dir, split="train", is_training=True)
    dataset_eval = create_dataset("", root=args.data_dir, split="validation", is_training=False)
    common = dict(input_size=data_config["input_size"], batch_size=args.batch_size, use_prefetcher=True,
                  mean=data_config["mean"], std=data_config["std"], num_workers=args.workers,
                  distributed=args.distributed, device=device)
    loader_train = create_loader(dataset_train, is_training=True, **common)
    loader_eval = create_loader(dataset_eval, is_training=False, crop_pct=data_config["crop_pct"], **common)
    train_loss_fn = LabelSmoothingCrossEntropy(smoothing=0.1)
    validate_loss_fn = torch.nn.CrossEntropyLoss()

    saver = output_dir = None
    if utils.is_primary(args):
        output_dir = utils.get_outdir(args.output, f"{args.experiment}-{int(time.time() * 1000)}")
        saver = utils.CheckpointSaver(model=model, optimizer=optimizer, args=args, checkpoint_dir=output_dir,
                                      recovery_dir=output_dir, max_history=2)
    if utils.is_primary(args) and args.log_wandb and has_wandb:
        wandb.init(project=args.experiment, config=args)

    lr_scheduler, num_epochs = create_scheduler_v2(optimizer, sched="cosine", num_epochs=args.epochs,
                                                   warmup_epochs=0, updates_per_epoch=len(loader_train))
    best_metric = best_epoch = None
    for epoch in range(num_epochs):
        if args.distributed and hasattr(loader_train.sampler, "set_epoch"):
            loader_train.sampler.set_epoch(epoch)
        train_metrics = train_one_epoch(epoch, model, loader_train, optimizer, train_loss_fn, args, lr_scheduler)
        eval_metrics = validate(model, loader_eval, validate_loss_fn, args)
        if output_dir is not None:
            lrs = [g["lr"] for g in optimizer.param_groups]
            utils.update_summary(epoch, train_metrics, eval_metrics, filename=os.path.join(output_dir, "summary.csv"),
                                 lr=sum(lrs) / len(lrs), write_header=best_metric is None,
                                 log_wandb=args.log_wandb and has_wandb)
        if saver is not None:
            best_metric, best_epoch = saver.save_checkpoint(epoch, metric=eval_metrics["top1"])
        lr_scheduler.step(epoch + 1, eval_metrics["top1"])
    if best_metric is not None:
        _logger.info(f"*** Best metric: {best_metric} (epoch {best_epoch})")
    if args.destroy and args.distributed:
        torch.distributed.destroy_process_group()
    # the harness reads this: when each rank left main() (the interpreter's exit follows)
    print(f"HANG-PROBE rank={args.rank} main-returned t={time.time():.3f}", flush=True)


if __name__ == "__main__":
    main()
