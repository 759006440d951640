"""Detection and segmentation models of Lambda's 2020 benchmark: YOLOv3, DeepLabv3, Mask R-CNN.

Over 600 lines because it restates three reference models layer by layer (YOLOv3, DeepLabv3,
Mask R-CNN); splitting one model's layers from its training step would scatter one source.

Written in plain ``torch.nn`` (no torchvision), random weights, synthetic inputs at the
published sizes. Throughput is counted in images. Everything that is data-dependent in the
real training step (anchor matching, proposal selection after NMS, RoI sampling, the FPN level
of each RoI) is replaced by a fixed-size selection made the way the reference makes it (top-k
counts, fixed quotas), so the traced step has the shapes of a full (worst-case) batch:

- ``yolov3``: ``yolov3.cfg`` at 608x608; ground-truth boxes sit in fixed grid cells and anchors
  (the ones a best-anchor match would choose for their sizes); the ignore mask (predictions
  whose IoU with any box exceeds 0.5) is computed as in Darknet.
- ``deeplabv3``: ResNet-101 at output stride 16 (the paper's training setting) with ASPP rates
  6/12/18 and multi-grid (1, 2, 4); the head is torchvision's (no auxiliary classifier).
- ``maskrcnn``: torchvision's ``maskrcnn_resnet50_fpn`` layers with 81 COCO classes; proposals
  are top-k without NMS (2000 per level, then 2000 per image); 512 RoIs per image (128
  positive) chosen by top-k in fixed quotas per FPN level, RoIAlign by ``grid_sample``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from whichgpu.schema import RunConfig, WorkloadInfo
from whichgpu.workloads.base import Batch, BuiltWorkload, Workload
from whichgpu.workloads.hf import default_dtype, weight_dtype
from whichgpu.workloads.registry import register

if TYPE_CHECKING:
    import torch
    from torch import nn

FAMILY = "seed_detection"
GT_BOXES = 8
"""Ground-truth objects per synthetic image (COCO train2017 averages 7.3 per image)."""

# --- YOLOv3 ----------------------------------------------------------------------------------

YOLO_SIZE = 608
YOLO_CLASSES = 80
YOLO_ANCHORS = (
    (10, 13),
    (16, 30),
    (33, 23),
    (30, 61),
    (62, 45),
    (59, 119),
    (116, 90),
    (156, 198),
    (373, 326),
)
"""Anchor sizes in pixels (``yolov3.cfg``); masks 6-8 at stride 32, 3-5 at 16, 0-2 at 8."""
YOLO_SCALES = ((32, (6, 7, 8)), (16, (3, 4, 5)), (8, (0, 1, 2)))
YOLO_IGNORE_IOU = 0.5


def _yolo_assignment(n: int) -> list[tuple[int, int, int, int]]:
    """Fixed (scale, anchor slot, grid y, grid x) of each ground-truth box."""
    out = []
    for i in range(n):
        scale, slot = i % 3, (i // 3) % 3
        grid = YOLO_SIZE // YOLO_SCALES[scale][0]
        out.append((scale, slot, (7 * i + 3) % grid, (11 * i + 5) % grid))
    return out


def _darknet_conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Module:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.1)
    )


def _yolov3_model() -> nn.Module:
    """``yolov3.cfg``: Darknet-53 (52 conv layers) and the three-scale detection head."""
    import torch
    from torch import nn

    class Residual(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.body = nn.Sequential(_darknet_conv(c, c // 2, 1), _darknet_conv(c // 2, c, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = x + self.body(x)
            return out

    def stage(cin: int, blocks: int) -> nn.Sequential:
        return nn.Sequential(
            _darknet_conv(cin, cin * 2, 3, 2), *[Residual(cin * 2) for _ in range(blocks)]
        )

    def head(cin: int, c: int) -> nn.Sequential:
        return nn.Sequential(
            _darknet_conv(cin, c, 1),
            _darknet_conv(c, c * 2, 3),
            _darknet_conv(c * 2, c, 1),
            _darknet_conv(c, c * 2, 3),
            _darknet_conv(c * 2, c, 1),
        )

    out_ch = 3 * (5 + YOLO_CLASSES)

    class YoloV3(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = _darknet_conv(3, 32, 3)
            self.stage1, self.stage2 = stage(32, 1), stage(64, 2)
            self.stage3, self.stage4, self.stage5 = stage(128, 8), stage(256, 8), stage(512, 4)
            self.head1 = head(1024, 512)
            self.out1 = nn.Sequential(_darknet_conv(512, 1024, 3), nn.Conv2d(1024, out_ch, 1))
            self.lat1 = _darknet_conv(512, 256, 1)
            self.head2 = head(768, 256)
            self.out2 = nn.Sequential(_darknet_conv(256, 512, 3), nn.Conv2d(512, out_ch, 1))
            self.lat2 = _darknet_conv(256, 128, 1)
            self.head3 = head(384, 128)
            self.out3 = nn.Sequential(_darknet_conv(128, 256, 3), nn.Conv2d(256, out_ch, 1))

        def forward(self, images: torch.Tensor, **targets: Any) -> list[torch.Tensor]:
            up = nn.functional.interpolate
            c3 = self.stage3(self.stage2(self.stage1(self.stem(images))))
            c4 = self.stage4(c3)
            x = self.head1(self.stage5(c4))
            p1 = self.out1(x)
            x = self.head2(torch.cat([up(self.lat1(x), scale_factor=2.0), c4], 1))
            p2 = self.out2(x)
            x = self.head3(torch.cat([up(self.lat2(x), scale_factor=2.0), c3], 1))
            return [p1, p2, self.out3(x)]

    return YoloV3()


def _yolo_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """YOLOv3 loss (Redmon & Farhadi 2018, Darknet ``yolo_layer.c``), summed over the batch and
    divided by its size: squared error on the box terms of assigned cells (scaled by
    ``2 - w*h``), binary cross-entropy on objectness everywhere except ignored predictions
    (IoU > 0.5 with a box) and on the 80 independent class scores of assigned cells."""
    import torch
    from torch.nn import functional as F

    boxes, classes = batch["boxes"], batch["classes"]  # (B, N, 4) cx cy w h in [0, 1]; (B, N)
    outs: list[torch.Tensor] = model(batch["images"])
    assign = _yolo_assignment(boxes.shape[1])
    b = boxes.shape[0]
    total = boxes.new_zeros(())
    for s, out in enumerate(outs):
        h, w = out.shape[-2:]
        p = out.view(b, 3, 5 + YOLO_CLASSES, h, w).permute(0, 1, 3, 4, 2)
        anchors = (
            torch.tensor(
                [YOLO_ANCHORS[a] for a in YOLO_SCALES[s][1]], device=out.device, dtype=torch.float32
            )
            / YOLO_SIZE
        )
        with torch.no_grad():  # Darknet's ignore mask: best IoU of each prediction with a box
            gy, gx = torch.meshgrid(
                torch.arange(h, device=out.device),
                torch.arange(w, device=out.device),
                indexing="ij",
            )
            pf = p[..., :4].float()
            cx = (pf[..., 0].sigmoid() + gx) / w
            cy = (pf[..., 1].sigmoid() + gy) / h
            pw = pf[..., 2].clamp(max=10).exp() * anchors[:, 0].view(1, 3, 1, 1)
            ph = pf[..., 3].clamp(max=10).exp() * anchors[:, 1].view(1, 3, 1, 1)
            pred = torch.stack([cx - pw / 2, cy - ph / 2, cx + pw / 2, cy + ph / 2], -1)
            gt = torch.cat(
                [boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], -1
            ).float()
            iou = _box_iou(pred.view(b, -1, 4), gt).view(b, 3, h, w, -1)
            ignore = iou.amax(-1) > YOLO_IGNORE_IOU
        mine = [(i, a, y, x) for i, (sc, a, y, x) in enumerate(assign) if sc == s]
        obj_target = torch.zeros(b, 3, h, w, device=out.device, dtype=p.dtype)
        weight = (~ignore).to(p.dtype)
        if mine:
            gi, ai, yi, xi = (torch.tensor(v, device=out.device) for v in zip(*mine, strict=True))
            obj_target[:, ai, yi, xi] = 1.0
            weight[:, ai, yi, xi] = 1.0
            ps = p[:, ai, yi, xi]  # (B, n, 85)
            tb = boxes[:, gi]
            grid_xy = torch.stack([xi, yi], -1).to(tb.dtype)
            t_xy = tb[..., :2] * torch.tensor([w, h], device=out.device) - grid_xy
            t_wh = torch.log(tb[..., 2:] / anchors[ai])
            box_scale = 2.0 - tb[..., 2] * tb[..., 3]
            coord = ((ps[..., :2].sigmoid() - t_xy) ** 2).sum(-1) + (
                (ps[..., 2:4] - t_wh) ** 2
            ).sum(-1)
            total = total + (box_scale * coord).sum()
            onehot = F.one_hot(classes[:, gi], YOLO_CLASSES).to(ps.dtype)
            total = total + F.binary_cross_entropy_with_logits(ps[..., 5:], onehot, reduction="sum")
        obj = F.binary_cross_entropy_with_logits(p[..., 4], obj_target, reduction="none")
        total = total + (obj * weight).sum()
    result: torch.Tensor = total / b
    return result


def _yolo_batch(model: nn.Module, batch_size: int) -> dict[str, Any]:
    import torch

    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    assign = _yolo_assignment(GT_BOXES)
    scale = torch.tensor(
        [YOLO_SIZE // YOLO_SCALES[s][0] for s, _, _, _ in assign],
        device=device,
        dtype=torch.float32,
    )
    cell = torch.tensor([[x, y] for _, _, y, x in assign], device=device, dtype=torch.float32)
    anchor = (
        torch.tensor(
            [YOLO_ANCHORS[YOLO_SCALES[s][1][a]] for s, a, _, _ in assign],
            device=device,
            dtype=torch.float32,
        )
        / YOLO_SIZE
    )
    offset = torch.rand(batch_size, GT_BOXES, 2, device=device)
    center = (cell + offset) / scale[:, None]
    size = anchor * torch.exp(0.2 * torch.randn(batch_size, GT_BOXES, 2, device=device))
    return {
        "images": torch.randn(batch_size, 3, YOLO_SIZE, YOLO_SIZE, device=device, dtype=dtype),
        "boxes": torch.cat([center, size.clamp(max=1.0)], -1),
        "classes": torch.randint(0, YOLO_CLASSES, (batch_size, GT_BOXES), device=device),
    }


def _box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of ``(..., N, 4)`` and ``(..., M, 4)`` xyxy boxes: ``(..., N, M)``."""
    import torch

    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    return inter / (area_a[..., :, None] + area_b[..., None, :] - inter + 1e-9)


# --- ResNet bodies (DeepLabv3, Mask R-CNN) ---------------------------------------------------


def _resnet_layers(
    blocks: tuple[int, ...],
    norm: Callable[[int], nn.Module],
    strides: tuple[int, ...],
    dilations: tuple[tuple[int, ...], ...],
) -> list[nn.Module]:
    """ResNet v1.5 (stride in the 3x3 conv, as torchvision): stem and four bottleneck stages.
    ``dilations[i][j]`` is the 3x3 dilation of block ``j`` of stage ``i``."""
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int, dilation: int) -> None:
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), norm(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, dilation, dilation, bias=False)
            self.bn2 = norm(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), norm(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = (
                None
                if stride == 1 and cin == cout
                else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            identity = x if self.downsample is None else self.downsample(x)
            result: torch.Tensor = self.relu(out + identity)
            return result

    stem = nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        norm(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    )
    layers: list[nn.Module] = [stem]
    cin = 64
    for i, n in enumerate(blocks):
        width = 64 * 2**i
        stage = [
            Bottleneck(
                cin if j == 0 else width * 4, width, strides[i] if j == 0 else 1, dilations[i][j]
            )
            for j in range(n)
        ]
        layers.append(nn.Sequential(*stage))
        cin = width * 4
    return layers


# --- DeepLabv3 -------------------------------------------------------------------------------

DEEPLAB_SIZE = 513
DEEPLAB_CLASSES = 21
DEEPLAB_RATES = (6, 12, 18)
DEEPLAB_MULTI_GRID = (1, 2, 4)


def _deeplabv3_model() -> nn.Module:
    """DeepLabv3, ResNet-101 at output stride 16: torchvision's ``DeepLabHead`` layers (ASPP
    with image pooling, 256 channels, then a 3x3 conv and the classifier)."""
    import torch
    from torch import nn

    def cbr(cin: int, cout: int, k: int, dilation: int = 1) -> list[nn.Module]:
        pad = dilation if k == 3 else 0
        return [
            nn.Conv2d(cin, cout, k, padding=pad, dilation=dilation, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        ]

    class ASPP(nn.Module):
        def __init__(self, cin: int, c: int) -> None:
            super().__init__()
            self.convs = nn.ModuleList(
                [nn.Sequential(*cbr(cin, c, 1))]
                + [nn.Sequential(*cbr(cin, c, 3, r)) for r in DEEPLAB_RATES]
            )
            self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), *cbr(cin, c, 1))
            self.project = nn.Sequential(*cbr(5 * c, c, 1), nn.Dropout(0.5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pooled = nn.functional.interpolate(
                self.pool(x), size=x.shape[-2:], mode="bilinear", align_corners=False
            )
            out: torch.Tensor = self.project(torch.cat([c(x) for c in self.convs] + [pooled], 1))
            return out

    dil = ((1,) * 3, (1,) * 4, (1,) * 23, tuple(2 * g for g in DEEPLAB_MULTI_GRID))
    body = _resnet_layers((3, 4, 23, 3), nn.BatchNorm2d, (1, 2, 2, 1), dil)

    class DeepLabV3(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = nn.Sequential(*body)
            self.classifier = nn.Sequential(
                ASPP(2048, 256), *cbr(256, 256, 3), nn.Conv2d(256, DEEPLAB_CLASSES, 1)
            )

        def forward(self, images: torch.Tensor, **targets: Any) -> torch.Tensor:
            logits = self.classifier(self.backbone(images))
            out: torch.Tensor = nn.functional.interpolate(
                logits, size=images.shape[-2:], mode="bilinear", align_corners=False
            )
            return out

    return DeepLabV3()


def _deeplab_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Pixel-wise cross-entropy of the logits upsampled to the 513x513 labels (255 = ignore)."""
    from torch.nn import functional as F

    logits = model(batch["images"])
    return F.cross_entropy(logits.float(), batch["labels"], ignore_index=255)


def _deeplab_batch(model: nn.Module, batch_size: int) -> dict[str, Any]:
    import torch

    param = next(model.parameters())
    size = (batch_size, DEEPLAB_SIZE, DEEPLAB_SIZE)
    return {
        "images": torch.randn(
            batch_size, 3, DEEPLAB_SIZE, DEEPLAB_SIZE, device=param.device, dtype=param.dtype
        ),
        "labels": torch.randint(0, DEEPLAB_CLASSES, size, device=param.device),
    }


# --- Mask R-CNN ------------------------------------------------------------------------------

MASK_H, MASK_W = 800, 1344
"""800x1333 (shorter side 800, longer at most 1333), padded to a multiple of 32 as the
reference batches images."""
MASK_CLASSES = 81
RPN_PRE_NMS = 2000
"""Proposals kept per FPN level before NMS (training)."""
RPN_POST_NMS = 2000
"""Proposals kept per image after NMS (training); here the top-k, without NMS."""
RPN_BATCH, RPN_POS = 256, 128
ROI_BATCH, ROI_POS = 512, 128
"""RoIs sampled per image for the box head and how many are positive (and get masks)."""
ROI_LEVELS = 4
"""P2-P5 pool RoIs; each takes a fixed quota of ROI_BATCH / 4 RoIs (a quarter positive)."""
BBOX_CLIP = math.log(1000.0 / 16)


def _boxes_encode(gt: torch.Tensor, ref: torch.Tensor, weights: tuple[float, ...]) -> torch.Tensor:
    import torch

    rw, rh = ref[..., 2] - ref[..., 0], ref[..., 3] - ref[..., 1]
    gw, gh = gt[..., 2] - gt[..., 0], gt[..., 3] - gt[..., 1]
    dx = weights[0] * ((gt[..., 0] + 0.5 * gw) - (ref[..., 0] + 0.5 * rw)) / rw
    dy = weights[1] * ((gt[..., 1] + 0.5 * gh) - (ref[..., 1] + 0.5 * rh)) / rh
    return torch.stack(
        [dx, dy, weights[2] * torch.log(gw / rw), weights[3] * torch.log(gh / rh)], -1
    )


def _boxes_decode(deltas: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    import torch

    w, h = ref[..., 2] - ref[..., 0], ref[..., 3] - ref[..., 1]
    cx, cy = ref[..., 0] + 0.5 * w, ref[..., 1] + 0.5 * h
    pcx, pcy = deltas[..., 0] * w + cx, deltas[..., 1] * h + cy
    pw = torch.exp(deltas[..., 2].clamp(max=BBOX_CLIP)) * w
    ph = torch.exp(deltas[..., 3].clamp(max=BBOX_CLIP)) * h
    boxes = torch.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], -1)
    limit = torch.tensor([MASK_W, MASK_H, MASK_W, MASK_H], device=boxes.device, dtype=boxes.dtype)
    return torch.minimum(boxes.clamp(min=0), limit)


def _roi_align(
    feat: torch.Tensor, rois: torch.Tensor, scale: float, out: int, sampling: int
) -> torch.Tensor:
    """RoIAlign (``aligned=False``, as torchvision's ``MultiScaleRoIAlign``) by ``grid_sample``:
    ``sampling`` x ``sampling`` bilinear samples per output bin, averaged. ``feat`` (B, C, H, W),
    ``rois`` (B, R, 4) in image pixels -> (B, R, C, out, out)."""
    import torch
    from torch.nn import functional as F

    b, r = rois.shape[:2]
    c, h, w = feat.shape[1:]
    n = out * sampling
    x1, y1 = rois[..., 0] * scale, rois[..., 1] * scale
    rw = (rois[..., 2] * scale - x1).clamp(min=1.0)
    rh = (rois[..., 3] * scale - y1).clamp(min=1.0)
    t = (torch.arange(n, device=rois.device, dtype=rois.dtype) + 0.5) / n
    xs = (x1[..., None] + t * rw[..., None]) * (2.0 / max(w - 1, 1)) - 1.0  # (B, R, n)
    ys = (y1[..., None] + t * rh[..., None]) * (2.0 / max(h - 1, 1)) - 1.0
    grid = torch.stack(
        [xs[:, :, None, :].expand(b, r, n, n), ys[:, :, :, None].expand(b, r, n, n)], -1
    )
    sampled = F.grid_sample(
        feat,
        grid.reshape(b, r * n, n, 2).to(feat.dtype),
        mode="bilinear",
        padding_mode="border",
        align_corners=True,
    )  # (B, C, R*n, n)
    if sampling > 1:
        sampled = F.avg_pool2d(sampled, sampling)
    return sampled.view(b, c, r, out, out).transpose(1, 2)


def _anchors(sizes: list[tuple[int, int]], device: torch.device) -> list[torch.Tensor]:
    """torchvision ``AnchorGenerator``: one size per level (32-512), ratios 0.5/1/2, anchors
    ordered (y, x, ratio)."""
    import torch

    out = []
    for (h, w), size in zip(sizes, (32, 64, 128, 256, 512), strict=True):
        ratios = torch.tensor([0.5, 1.0, 2.0], device=device)
        hr = ratios.sqrt()
        ws, hs = size / hr, size * hr
        base = (torch.stack([-ws, -hs, ws, hs], 1) / 2).round()
        sy, sx = MASK_H // h, MASK_W // w
        yy, xx = torch.meshgrid(
            torch.arange(h, device=device, dtype=torch.float32) * sy,
            torch.arange(w, device=device, dtype=torch.float32) * sx,
            indexing="ij",
        )
        shifts = torch.stack([xx, yy, xx, yy], -1).reshape(-1, 1, 4)
        out.append((shifts + base[None]).reshape(-1, 4))
    return out


def _maskrcnn_model(num_classes: int = MASK_CLASSES) -> nn.Module:
    """torchvision ``maskrcnn_resnet50_fpn`` (v1) layers: ResNet-50 with frozen batch norm
    (stem and res2 frozen), FPN P2-P6, RPN, two-FC box head, four-conv mask head."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class FrozenBatchNorm2d(nn.Module):
        weight: torch.Tensor
        bias: torch.Tensor
        running_mean: torch.Tensor
        running_var: torch.Tensor

        def __init__(self, n: int) -> None:
            super().__init__()
            for name, init in (
                ("weight", 1.0),
                ("bias", 0.0),
                ("running_mean", 0.0),
                ("running_var", 1.0),
            ):
                self.register_buffer(name, torch.full((n,), init))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = self.weight * (self.running_var + 1e-5).rsqrt()
            shift = self.bias - self.running_mean * scale
            out: torch.Tensor = x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)
            return out

    ones = ((1,) * 3, (1,) * 4, (1,) * 6, (1,) * 3)
    body = _resnet_layers((3, 4, 6, 3), FrozenBatchNorm2d, (1, 2, 2, 2), ones)
    for frozen in body[:2]:  # trainable_backbone_layers=3 (Detectron FREEZE_AT=2)
        frozen.requires_grad_(False)

    class MaskRCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.ModuleList(body)
            self.fpn_inner = nn.ModuleList([nn.Conv2d(c, 256, 1) for c in (256, 512, 1024, 2048)])
            self.fpn_layer = nn.ModuleList([nn.Conv2d(256, 256, 3, padding=1) for _ in range(4)])
            self.rpn_conv = nn.Conv2d(256, 256, 3, padding=1)
            self.rpn_cls, self.rpn_bbox = nn.Conv2d(256, 3, 1), nn.Conv2d(256, 12, 1)
            self.fc6, self.fc7 = nn.Linear(256 * 7 * 7, 1024), nn.Linear(1024, 1024)
            self.cls_score = nn.Linear(1024, num_classes)
            self.bbox_pred = nn.Linear(1024, num_classes * 4)
            self.mask_head = nn.Sequential(
                *[
                    m
                    for _ in range(4)
                    for m in (nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True))
                ]
            )
            self.mask_up = nn.ConvTranspose2d(256, 256, 2, 2)
            self.mask_logits = nn.Conv2d(256, num_classes, 1)

        def features(self, images: torch.Tensor) -> list[torch.Tensor]:
            x = self.body[0](images)
            cs = []
            for stage in self.body[1:]:
                x = stage(x)
                cs.append(x)
            last = self.fpn_inner[3](cs[3])
            ps = [self.fpn_layer[3](last)]
            for i in (2, 1, 0):
                lateral = self.fpn_inner[i](cs[i])
                last = lateral + F.interpolate(last, size=lateral.shape[-2:], mode="nearest")
                ps.insert(0, self.fpn_layer[i](last))
            ps.append(F.max_pool2d(ps[-1], 1, 2, 0))  # P6 (LastLevelMaxPool)
            return ps

        def forward(
            self,
            images: torch.Tensor,
            boxes: torch.Tensor,
            classes: torch.Tensor,
            masks: torch.Tensor,
        ) -> torch.Tensor:
            ps = self.features(images)
            b = images.shape[0]
            # RPN head on every level.
            objs, deltas = [], []
            for p in ps:
                t = F.relu(self.rpn_conv(p))
                h, w = p.shape[-2:]
                objs.append(self.rpn_cls(t).permute(0, 2, 3, 1).reshape(b, -1))
                deltas.append(
                    self.rpn_bbox(t).view(b, 3, 4, h, w).permute(0, 3, 4, 1, 2).reshape(b, -1, 4)
                )
            anchors = _anchors([(p.shape[-2], p.shape[-1]) for p in ps], images.device)
            # Proposals: top-k per level, then top-k per image (NMS left out: fixed count).
            with torch.no_grad():
                cand_s, cand_b = [], []
                for o, d, a in zip(objs, deltas, anchors, strict=True):
                    score, idx = o.detach().float().topk(min(RPN_PRE_NMS, o.shape[1]), dim=1)
                    sel = torch.gather(d.detach().float(), 1, idx[..., None].expand(-1, -1, 4))
                    cand_s.append(score)
                    cand_b.append(_boxes_decode(sel, a[idx]))
                _, keep = torch.cat(cand_s, 1).topk(RPN_POST_NMS, dim=1)
                proposals = torch.gather(torch.cat(cand_b, 1), 1, keep[..., None].expand(-1, -1, 4))
            loss = self.rpn_loss(
                torch.cat(objs, 1), torch.cat(deltas, 1), torch.cat(anchors, 0), boxes
            )
            return loss + self.roi_loss(ps[:ROI_LEVELS], proposals, boxes, classes, masks)

        def rpn_loss(
            self, obj: torch.Tensor, delta: torch.Tensor, anchors: torch.Tensor, gt: torch.Tensor
        ) -> torch.Tensor:
            """256 anchors per image, 128 positive (IoU >= 0.7) and 128 negative (< 0.3)."""
            with torch.no_grad():
                iou, matched = _box_iou(anchors[None], gt).max(-1)  # (B, A)
                _, pos = iou.topk(RPN_POS, dim=1)
                neg_score = torch.where(iou < 0.3, torch.rand_like(iou), -1.0)
                _, neg = neg_score.topk(RPN_BATCH - RPN_POS, dim=1)
                target_box = torch.gather(
                    gt, 1, torch.gather(matched, 1, pos)[..., None].expand(-1, -1, 4)
                )
                target = _boxes_encode(target_box, anchors[pos], (1.0, 1.0, 1.0, 1.0))
            logits = torch.cat([torch.gather(obj, 1, pos), torch.gather(obj, 1, neg)], 1)
            labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)], 1).to(logits.dtype)
            reg = torch.gather(delta, 1, pos[..., None].expand(-1, -1, 4))
            cls_loss = F.binary_cross_entropy_with_logits(logits, labels)
            box_loss = F.smooth_l1_loss(reg.float(), target, beta=1 / 9, reduction="sum")
            return cls_loss + box_loss / logits.numel()

        def roi_loss(
            self,
            ps: list[torch.Tensor],
            proposals: torch.Tensor,
            gt: torch.Tensor,
            classes: torch.Tensor,
            masks: torch.Tensor,
        ) -> torch.Tensor:
            b = proposals.shape[0]
            per_level, pos_per_level = ROI_BATCH // ROI_LEVELS, ROI_POS // ROI_LEVELS
            with torch.no_grad():
                cand = torch.cat([proposals, gt], 1)  # ground truth joins the proposals
                iou, matched = _box_iou(cand, gt).max(-1)
                area = (cand[..., 2] - cand[..., 0]) * (cand[..., 3] - cand[..., 1])
                level = torch.floor(4 + torch.log2(area.clamp(min=1e-6).sqrt() / 224) + 1e-6)
                level = level.clamp(2, 5) - 2
                picks = []
                for lvl in range(ROI_LEVELS):
                    here = level == lvl
                    _, pos = torch.where(here, iou, -1.0).topk(pos_per_level, dim=1)
                    neg_score = torch.where(here & (iou < 0.5), torch.rand_like(iou), -2.0)
                    _, neg = neg_score.topk(per_level - pos_per_level, dim=1)
                    picks.append(torch.cat([pos, neg], 1))
                idx = torch.stack(picks, 1)  # (B, levels, per_level); positives first
                rois = torch.gather(
                    cand[:, None].expand(-1, ROI_LEVELS, -1, -1),
                    2,
                    idx[..., None].expand(-1, -1, -1, 4),
                )
                gt_idx = torch.gather(matched[:, None].expand(-1, ROI_LEVELS, -1), 2, idx)
                labels = torch.gather(classes[:, None].expand(-1, ROI_LEVELS, -1), 2, gt_idx)
                labels[..., pos_per_level:] = 0
                pos_rois = rois[:, :, :pos_per_level]
                pos_gt = gt_idx[:, :, :pos_per_level]
                gt_boxes = torch.gather(
                    gt[:, None].expand(-1, ROI_LEVELS, -1, -1),
                    2,
                    pos_gt[..., None].expand(-1, -1, -1, 4),
                )
                box_target = _boxes_encode(gt_boxes, pos_rois, (10.0, 10.0, 5.0, 5.0))
            # Box head on 512 RoIs per image, each pooled 7x7 from its own FPN level.
            pooled = torch.cat(
                [_roi_align(p, rois[:, i], 0.25 / 2**i, 7, 2) for i, p in enumerate(ps)], 1
            )
            x = F.relu(self.fc7(F.relu(self.fc6(pooled.flatten(2)))))  # (B, 512, 1024)
            cls_logits = self.cls_score(x)
            reg = self.bbox_pred(x).view(b, ROI_LEVELS, per_level, -1, 4)[:, :, :pos_per_level]
            flat_labels = labels.reshape(b, -1)
            cls_loss = F.cross_entropy(cls_logits.float().flatten(0, 1), flat_labels.flatten())
            pos_labels = labels[:, :, :pos_per_level]
            reg = torch.gather(reg, 3, pos_labels[..., None, None].expand(-1, -1, -1, 1, 4))
            box_loss = (
                F.smooth_l1_loss(reg.squeeze(3).float(), box_target, beta=1 / 9, reduction="sum")
                / flat_labels.numel()
            )
            # Mask head on the 128 positive RoIs per image, pooled 14x14.
            mpooled = torch.cat(
                [_roi_align(p, pos_rois[:, i], 0.25 / 2**i, 14, 2) for i, p in enumerate(ps)], 1
            )
            m = F.relu(self.mask_up(self.mask_head(mpooled.flatten(0, 1))))
            mlogits = self.mask_logits(m)  # (B*128, classes, 28, 28)
            sel = pos_labels.reshape(-1)[:, None, None, None].expand(-1, 1, 28, 28)
            mlogits = torch.gather(mlogits, 1, sel).squeeze(1)
            with torch.no_grad():  # ground-truth masks cropped to each RoI, 28x28
                gm = _roi_align(masks.to(mlogits.dtype), pos_rois.flatten(1, 2), 1.0, 28, 1)
                g = pos_gt.reshape(b, -1)[:, :, None, None, None].expand(-1, -1, 1, 28, 28)
                mask_target = torch.gather(gm, 2, g).reshape(-1, 28, 28)
            mask_loss = F.binary_cross_entropy_with_logits(mlogits.float(), mask_target.float())
            return cls_loss + box_loss + mask_loss

    return MaskRCNN()


def _maskrcnn_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """RPN objectness + RPN box + box-head classification + box regression + mask losses,
    as torchvision's ``MaskRCNN`` sums them in training."""
    loss: torch.Tensor = model(**batch)
    return loss


def _maskrcnn_batch(model: nn.Module, batch_size: int) -> dict[str, Any]:
    import torch

    param = next(model.parameters())
    device = param.device
    shape = (batch_size, GT_BOXES)
    size = torch.tensor([MASK_W, MASK_H], device=device, dtype=torch.float32)
    xy = torch.rand(*shape, 2, device=device) * 0.7 * size
    wh = (torch.rand(*shape, 2, device=device) * 0.28 + 0.02) * size
    return {
        "images": torch.randn(batch_size, 3, MASK_H, MASK_W, device=device, dtype=param.dtype),
        "boxes": torch.cat([xy, xy + wh], -1),
        "classes": torch.randint(1, MASK_CLASSES, shape, device=device),
        "masks": torch.randint(0, 2, (*shape, MASK_H, MASK_W), device=device, dtype=torch.uint8),
    }


# --- Registration ----------------------------------------------------------------------------


def _make(
    info: WorkloadInfo,
    model_fn: Callable[[], nn.Module],
    batch_fn: Callable[[nn.Module, int], dict[str, Any]],
    loss: Callable[[nn.Module, Batch], torch.Tensor],
) -> Workload:
    def build(run: RunConfig) -> BuiltWorkload:
        with default_dtype(weight_dtype(run)):
            model = model_fn()

        def make_batch(batch_size: int, seq_len: int | None) -> dict[str, Any]:
            return batch_fn(model, batch_size)

        return BuiltWorkload(
            model=model, make_batch=make_batch, loss=loss, units_per_sample=lambda seq_len: 1
        )

    return Workload(info=info, build=build)


YOLOV3 = WorkloadInfo(
    name="yolov3",
    family=FAMILY,
    task="object detection",
    description="YOLOv3 (yolov3.cfg): Darknet-53 backbone, three detection scales (strides 32, "
    "16, 8) with 3 anchors each, 80 COCO classes, 608x608 input; YOLOv3 loss on 8 synthetic "
    "boxes per image in fixed grid cells",
    input_desc=f"3x{YOLO_SIZE}x{YOLO_SIZE} image with {GT_BOXES} boxes",
    throughput_unit="images",
    default_batch_size=8,
    params_published=61_949_149,
    params_source="Darknet yolov3.cfg (80 classes) as loaded by ultralytics/yolov3: 61,949,149 "
    "parameters (BN scale and shift counted, running statistics not); Darknet-53 "
    "backbone alone 40,584,928 (paper Table 2 lists FLOPs, not parameters)",
    reference="https://pjreddie.com/media/files/papers/YOLOv3.pdf",
)
DEEPLABV3 = WorkloadInfo(
    name="deeplabv3",
    family=FAMILY,
    task="semantic segmentation",
    description="DeepLabv3: ResNet-101 at output stride 16 (multi-grid 1/2/4), ASPP with rates "
    "6/12/18 and image pooling, 21 PASCAL VOC classes, 513x513 input, pixel-wise "
    "cross-entropy; torchvision's head, no auxiliary classifier",
    input_desc=f"3x{DEEPLAB_SIZE}x{DEEPLAB_SIZE} image with per-pixel labels",
    throughput_unit="images",
    default_batch_size=4,
    params_published=58_630_997,
    params_source="torchvision DeepLabV3_ResNet101_Weights num_params 60,996,202 "
    "(torchvision/models/segmentation/deeplabv3.py, 21 classes, with aux classifier) less the "
    "auxiliary FCNHead(1024, 21) of 2,365,205",
    reference="https://arxiv.org/abs/1706.05587",
)
MASKRCNN = WorkloadInfo(
    name="maskrcnn",
    family=FAMILY,
    task="instance segmentation",
    description="Mask R-CNN, ResNet-50-FPN (torchvision v1 layers), 81 COCO classes, 800x1333 "
    "input padded to 800x1344; top-k proposals without NMS (2000/level, 2000/image), 512 "
    "RoIs/image (128 positive, with masks) in fixed quotas per FPN level, RoIAlign by "
    "grid_sample, 8 synthetic objects per image",
    input_desc=f"3x{MASK_H}x{MASK_W} image with {GT_BOXES} boxes and masks",
    throughput_unit="images",
    default_batch_size=2,
    params_published=44_401_393,
    params_source="torchvision MaskRCNN_ResNet50_FPN_Weights num_params 44,401,393 "
    "(torchvision/models/detection/mask_rcnn.py), which has 91 classes; with 81 classes the "
    "same layers hold 44,347,573",
    reference="https://arxiv.org/abs/1703.06870",
)

register(_make(YOLOV3, _yolov3_model, _yolo_batch, _yolo_loss))
register(_make(DEEPLABV3, _deeplabv3_model, _deeplab_batch, _deeplab_loss))
register(_make(MASKRCNN, _maskrcnn_model, _maskrcnn_batch, _maskrcnn_loss))
