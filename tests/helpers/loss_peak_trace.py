"""Peak bytes per logit element of torch's cross-entropy over fp32-upcast logits, traced (run as a script:
it starts a fake process group of its own; prints one JSON line).

A bf16 head [N, h] @ [h, V] gives the logits, upcast with ``.float()`` as torchtitan's model and the
trainer do; the loss is F.cross_entropy, on plain logits ("plain") and on logits sharded over the
vocabulary of a two-rank fake group under ``loss_parallel`` ("vocab_parallel"); the predictions are
dropped before the backward (torchtitan's train step deletes them). torch's MemTracker follows every
tensor's storage; the peak over the whole forward and backward is divided by the rank's logit elements
(N x V, or N x V/2 sharded). The head's inputs, weights and their gradients are a few percent of it.
"""

from __future__ import annotations

import json

N, H, V = 4096, 64, 8192


def peak_bytes_per_logit(vocab_parallel: bool) -> float:
    import torch
    import torch.nn.functional as F
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    w = torch.randn(H, V).to(torch.bfloat16)
    h = torch.randn(N, H, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, V, (N,))
    tracker = MemTracker()
    with tracker:
        if vocab_parallel:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
            from torch.distributed.tensor.parallel import loss_parallel

            mesh = init_device_mesh("cpu", (2,))
            wd = distribute_tensor(w, mesh, [Shard(1)]).requires_grad_()
            pred = (DTensor.from_local(h, mesh, [Replicate()]) @ wd).float()
            with loss_parallel():
                loss = F.cross_entropy(pred, target)
                del pred
                loss.backward()
        else:
            wp = w.requires_grad_()
            pred = (h @ wp).float()
            loss = F.cross_entropy(pred, target)
            del pred
            loss.backward()
    peak = tracker.get_tracker_snapshot("peak")
    total = sum(by_kind["Total"] for by_kind in peak.values())
    return total / (N * (V // 2 if vocab_parallel else V))


def main() -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        print(json.dumps({"plain": peak_bytes_per_logit(False), "vocab_parallel": peak_bytes_per_logit(True)}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
